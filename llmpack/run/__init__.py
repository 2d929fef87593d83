"""One pipeline run and what follows it: locally, on a cluster, and the run directories it leaves.

:mod:`.local` runs the pipeline on one backend on this machine (validate, run, measure, summarise),
:mod:`.direct` is the ``direct`` backend (every step a subprocess: the reference),
:mod:`.submit` and :mod:`.submit_command` hand a compiled pipeline to a cluster backend,
:mod:`.sync` sends a kept run directory's records to MLflow and :mod:`.clean` removes old failed
ones. It may import ``components``, the backend registry, :mod:`llmpack.compile` and
:mod:`llmpack.ui`; nothing is imported here, so ``llmpack --help`` stays fast.
"""
