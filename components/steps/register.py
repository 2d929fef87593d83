"""register: log the adapter (or full weights) to MLflow and register a model version."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from components import settings
from components.dsl import Execution, Input, Metrics, Model, Output, Resources, step
from components.reporting import current
from components.training.modeling import MODEL_META


def open_tracking() -> None:
    """register's start-up: open the tracking store (an http(s) one: nothing to import; else MLflow, which keeps it per URI)."""
    if os.environ.get(settings.MLFLOW_LOGGING.name, "1") != "0":
        from components.record import tracking

        tracking.step_client()


def model_client(mc: Any, run_id: str) -> Any:
    """``mc`` when it is the REST client and the server both keeps the run's artifacts and is the registry, else MLflow's.

    ``mlflow server`` proxies artifacts by default (``mlflow-artifacts:/``); artifacts in S3, GCS or
    a path on the server, or a separate ``MLFLOW_REGISTRY_URI``, need MLflow's own client.
    """
    from components.record import rest, tracking

    if not isinstance(mc, rest.RestClient):
        return mc
    registry = (os.environ.get("MLFLOW_REGISTRY_URI") or "").strip()
    if (not registry or registry == mc.tracking_uri) and mc.proxies_artifacts(run_id):
        return mc
    return tracking.client(mc.tracking_uri)


@step(execution=Execution(resources=Resources(cpu=1, memory="2Gi")), warm_up=open_tracking)
def register(
    model: Input[Model],
    metrics: Input[Metrics],
    registration: Output[Metrics],
    model_name: str = "llmpack-finetuned",
) -> None:
    """Log the weights to the pipeline run in MLflow and register them as a model version.

    ``llmpack compare`` runs set ``LLMPACK_REGISTER_VERSION=0``: their weights are logged on each
    run, but a comparison of orchestrators does not add a model version per round to the registry.
    """
    from components.record import tracking

    tel = current()
    meta = json.loads((Path(model.path) / MODEL_META).read_text())
    evaluation = json.loads((Path(metrics.path) / "metrics.json").read_text())
    weights = Path(model.path) / ("adapter" if meta["method"] == "lora" else "full")
    record = {"model_name": model_name, "weights": weights.name, "base_model": meta["base_model"], "registered": False}
    if os.environ.get(settings.MLFLOW_LOGGING.name, "1") != "0" and tel is not None:
        retry = tracking.upload_retry()  # each request retried within the bound, as MLflow's client retries its own
        mc = tracking.step_client(each_request=lambda send: tracking.with_retries(send, retry))
        run_id = tracking.open_pipeline_run(mc, tel.ctx)
        run = mc.get_run(run_id)  # read once: logging artifacts changes neither its artifact URI nor its tags
        mc = model_client(mc, run_id)
        mc.log_artifacts(run_id, str(weights), artifact_path=f"model/{weights.name}")
        mc.log_artifact(run_id, str(Path(model.path) / MODEL_META), artifact_path="model")
        mc.log_artifact(run_id, str(Path(metrics.path) / "metrics.json"), artifact_path="evaluation")
        source = f"{run.info.artifact_uri}/model"
        try:
            mc.create_registered_model(model_name)
        except Exception:  # noqa: BLE001 - already registered
            pass
        run_tags = {k: v for k, v in run.data.tags.items() if k.startswith("llmpack.") and k != "llmpack.record"}
        tags = {**run_tags, **tel.ctx.tags(), "llmpack.base_model": meta["base_model"], "llmpack.method": meta["method"],
                "llmpack.eval_loss": f"{evaluation['eval_loss']:.6f}"}
        record.update(run_id=run_id, source=source)
        if os.environ.get(settings.REGISTER_VERSION.name, "1") != "0":
            version = mc.create_model_version(model_name, source=source, run_id=run_id, tags=tags)
            record.update(registered=True, version=str(version.version))
        else:  # a measurement round (llmpack compare): the weights are on the run, no version per round
            record["skipped"] = f"{settings.REGISTER_VERSION.name}=0"
    (Path(registration.path) / "registration.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")

