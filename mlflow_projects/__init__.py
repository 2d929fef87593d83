"""MLflow Projects backend: the pipeline compiled to MLproject directories and run with ``mlflow run``.

* :mod:`mlflow_projects.compiler` -- ``write_project(pipe, out_dir)`` writes ``finetune/`` (local,
  ``--env-manager local``) and ``finetune-k8s/`` (``--backend kubernetes``); the committed copies
  beside this file are golden files.
* :mod:`mlflow_projects.driver` -- the generic ``main`` entry point, imported by each project's
  few-line ``main.py``: runs the steps as nested child runs in DAG order, from ``pipeline.json``.
* :mod:`mlflow_projects.backend` -- the backend as ``llmpack`` sees it (:mod:`components.backend`).
* :mod:`mlflow_projects.local` -- ``run_local``: the backend interface of ``llmpack.run.direct``.
* :mod:`mlflow_projects.submit` -- ``submit(...)`` / ``wait_for_completion(summary)``: the MLflow run
  and the Kubernetes Job MLflow's Kubernetes backend would create (``llmpack cluster submit mlflow``).
"""
