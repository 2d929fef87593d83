"""register: log the tuned model to MLflow as a servable pyfunc model, register a version, promote it or not.

The run's ``model`` artifact holds the adapter (or full weights) as before, and around it an MLflow
pyfunc model (:mod:`components.serving.package`) that ``mlflow.pyfunc.load_model`` and
``mlflow models serve`` load without llmpack; ``merge=true`` adds ``merged/``, full weights in the
Hugging Face layout. The new version is the ``challenger``; it becomes the ``champion`` when
:func:`components.serving.promotion.decide` says so (``promote=false``: never).

Nothing on disk is taken at its word: the model must be the one finetune sealed
(:mod:`components.serving.sealed`; what is logged is a private copy of exactly those bytes), the
evaluation must carry the user's signature for the very
model files being registered (:func:`components.serving.signed.verified_evaluation`; else one line,
exit 2, nothing logged), the gate is recomputed from its signed figures, and each new version is
signed over its name, version, run, source, the sha256 of every model file and the figures
promotion compares (:func:`components.serving.signed.version_tags`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from components import bounded, settings
from components.dsl import Execution, Input, Metrics, Model, Output, Resources, step
from components.errors import InputError
from components.reporting import current
from components.serving import promotion, sealed, signed, spread
from components.training.modeling import MODEL_META


def open_tracking() -> None:
    """register's start-up: open the tracking store.

    An http(s) one: nothing to import; else MLflow, which keeps it per URI.
    """
    if os.environ.get(settings.MLFLOW_LOGGING.name, "1") != "0":
        from components.record import tracking

        tracking.step_client()


def model_client(mc: Any, run_id: str) -> Any:
    """``mc`` when it is the REST client and the server both keeps the run's artifacts and is the registry, else
    MLflow's.

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


def record_figures(run: Any) -> dict[str, str]:
    """The run's cost and spin-up as version tags, where its record has them when register runs."""
    metrics = getattr(run.data, "metrics", None) or {}
    return {f"llmpack.{key}": f"{metrics[key]:.6g}" for key in promotion.RECORD_FIGURES if key in metrics}


@step(execution=Execution(resources=Resources(cpu=1, memory="2Gi")), warm_up=open_tracking)
def register(
    model: Input[Model],
    metrics: Input[Metrics],
    registration: Output[Metrics],
    model_name: str = "llmpack-finetuned",
    promote: bool = True,
    merge: bool = False,
) -> None:
    """Log the servable model to the pipeline run in MLflow, register it as a version and set its aliases.

    ``llmpack compare`` runs set ``LLMPACK_REGISTER_VERSION=0``: their weights are logged on each
    run, but a comparison of orchestrators does not add a model version per round to the registry
    (nor build a servable model around the weights, nor move an alias). The eval set the version
    was scored on is the evaluation's ``eval_set`` (:func:`components.serving.promotion.eval_set_fingerprint`).
    """
    tel = current()
    pipeline_run = tel.ctx.pipeline_run if tel is not None else ""
    model_dir = Path(model.path)
    sealed_files = sealed.verified_model(model_dir, pipeline_run)["files"]  # what finetune wrote, signed
    # before anything is logged: the user's key signed this evaluation, of these files, in this run
    evaluation = signed.verified_evaluation(Path(metrics.path), model=sealed_files, pipeline_run=pipeline_run)
    with tempfile.TemporaryDirectory(prefix="llmpack-register-") as scratch:
        # logged, packaged and merged from a private copy of exactly the sealed bytes (read once)
        copy = sealed.private_copy(model_dir, sealed_files, Path(scratch) / "model")
        _register(copy, Path(registration.path), Path(scratch), tel=tel, evaluation=evaluation,
                  files=dict(sealed_files), model_name=model_name, promote=promote, merge=merge)


def _register(model_dir: Path, registration_dir: Path, scratch: Path, *, tel: Any,
              evaluation: dict[str, Any], files: dict[str, Any], model_name: str, promote: bool, merge: bool) -> None:
    """register's work on the verified private copy ``model_dir``: log it, register a version, promote it or not."""
    from components.record import tracking
    from components.serving.package import write_merged, write_servable

    meta = bounded.read_json(model_dir / MODEL_META)
    if not isinstance(meta, dict) or meta.get("method") not in ("lora", "full"):
        raise InputError(f"{MODEL_META}: not a finetune output's metadata (method lora or full)")
    weights = model_dir / ("adapter" if meta["method"] == "lora" else "full")
    record: dict[str, Any] = {"model_name": model_name, "weights": weights.name, "base_model": meta["base_model"],
                              "registered": False, "merged": merge}
    if os.environ.get(settings.MLFLOW_LOGGING.name, "1") != "0" and tel is not None:
        retry = tracking.upload_retry()  # each request retried within the bound, as MLflow's client retries its own
        mc = tracking.step_client(each_request=lambda send: tracking.with_retries(send, retry))
        run_id = tracking.open_pipeline_run(mc, tel.ctx)
        run = mc.get_run(run_id)  # read once: logging artifacts changes neither its artifact URI nor its tags
        tracking.check_artifact_uri(run.info.artifact_uri, tracking.tracking_uri())  # never a stranger's host
        mc = model_client(mc, run_id)
        versioned = os.environ.get(settings.REGISTER_VERSION.name, "1") != "0"
        mc.log_artifacts(run_id, str(weights), artifact_path=f"model/{weights.name}")
        mc.log_artifact(run_id, str(model_dir / MODEL_META), artifact_path="model")
        # a compare round's weights only: building the servable (torch, a model) is no part of what it measures
        if versioned:
            servable = write_servable(model_dir, scratch / "pyfunc")
            files.update(signed.tree_digests(servable))  # every file under model/, as the loader will see it
            # MLmodel beside the weights: a pyfunc model
            mc.log_artifacts(run_id, str(servable), artifact_path="model")
        if merge:
            mc.log_artifacts(run_id, str(write_merged(model_dir, scratch / "merged")), artifact_path="merged")
        logged = scratch / "evaluation" / "metrics.json"  # the verified figures, not the file read again
        logged.parent.mkdir()
        logged.write_text(json.dumps(evaluation, indent=2, sort_keys=True) + "\n")
        mc.log_artifact(run_id, str(logged), artifact_path="evaluation")
        source = f"{run.info.artifact_uri}/model"
        try:
            mc.create_registered_model(model_name)
        except Exception:  # noqa: BLE001 - already registered
            pass
        run_tags = {k: v for k, v in run.data.tags.items() if k.startswith("llmpack.") and k != "llmpack.record"}
        loss = promotion.parse_figure(str(evaluation.get("eval_loss")))
        tags = {**run_tags, **tel.ctx.tags(), "llmpack.base_model": meta["base_model"],
                "llmpack.method": meta["method"],
                "llmpack.eval_loss": f"{loss if loss is not None else float('nan'):.6f}", "llmpack.run_id": run_id,
                **promotion.figure_tags(evaluation), **record_figures(run)}
        if merge:
            tags["llmpack.merged_weights"] = f"{run.info.artifact_uri}/merged"
        record.update(run_id=run_id, source=source)
        if versioned:
            metric = promotion.PROMOTION_METRIC
            decision = promotion.decide(
                metric=metric, value=promotion.parse_figure(str(evaluation.get(metric.name))),
                eval_set=str(evaluation.get("eval_set") or ""),
                passed=spread.gate_passed(evaluation, own=signed.gate_passed(evaluation)),  # over seeds, where given
                promote=promote, champion=promotion.current_champion(mc, model_name, metric))
            version = str(mc.create_model_version(model_name, source=source, run_id=run_id,
                                                  tags={**tags, **decision.tags}).version)
            payload = signed.version_payload(name=model_name, version=version, run_id=run_id, source=source,
                                             files=files, evaluation=evaluation)
            for key, value in signed.version_tags(payload).items():  # signed before any alias points at it
                promotion.set_version_tag(mc, model_name, version, key, value)
            promotion.set_aliases(mc, model_name, version, decision, run_id=run_id)
            mc.set_tag(run_id, promotion.TAG, decision.phrase(version))  # the run's side, for its report
            record.update(registered=True, version=version, champion=decision.champion,
                          promotion=decision.phrase(version))
        else:  # a measurement round (llmpack compare): the weights are on the run, no version per round
            record["skipped"] = f"{settings.REGISTER_VERSION.name}=0"
    bounded.write_atomic(registration_dir / "registration.json",
                         (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
