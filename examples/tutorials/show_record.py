"""Print an llmpack pipeline record in the MLflow store: what any run left, whoever started it.

    python examples/tutorials/show_record.py                  # the newest (MLFLOW_TRACKING_URI, else ./mlflow.db)
    python examples/tutorials/show_record.py --run-id RUN_ID  # yours: the run id your run printed

The record is the MLflow run tagged ``llmpack.record=pipeline``; its metrics and tags were
written by the pipeline's own summarizing task (``components.record``). A run with no submit
instant (KFP's own CLI, plain kfp.local) is timed from its first pod: its ``*_from_first_pod_s``
metrics are shown in place of the ones timed from submit.
"""

from __future__ import annotations

import argparse
import re
import sys

from components.record import tracking
from components.record.cost import NOT_PRICED, PRICE_TAGS

METRICS = ("spinup_s", "time_to_first_step_s", "total_s", "pipeline_overhead_s", "train_s", "tokens_per_s",
           "eval_loss", "base_eval_loss", "gpu_hours", "cost_usd", "goodput")
TAGS = ("llmpack.orchestrator", "llmpack.pipeline_run", "llmpack.submit_time_source", "llmpack.gpu_type",
        "llmpack.gpu_count", "llmpack.price_per_gpu_hour", "llmpack.price_source", "llmpack.status")
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
NO_GPU = f"{NOT_PRICED} (no step asks for a GPU)"  # the one word for it (docs/glossary.md)


def tag_lines(tags: dict[str, str]) -> list[str]:
    """The record's tags, one line each; a pipeline with no GPU step has no price: not applicable, not unknown."""
    no_gpu = tags.get("llmpack.gpu_count") == "0"
    return [f"  {key:36} {NO_GPU if no_gpu and key in PRICE_TAGS else tags.get(key, '-')}" for key in TAGS]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Print an llmpack pipeline record (default: the newest).")
    parser.add_argument("run_id_arg", nargs="?", metavar="RUN_ID", help="same as --run-id")
    parser.add_argument("--run-id", help="the MLflow run id of the record to print")
    args = parser.parse_args(argv)
    run_id = args.run_id or args.run_id_arg
    mc = tracking.client()
    if run_id:
        if not RUN_ID.match(run_id):
            print(f"show_record.py: --run-id {run_id[:40]!r}: expected 32 hex digits (an MLflow run id)",
                  file=sys.stderr)
            return 2
        try:
            run = mc.get_run(run_id)
        except Exception:  # noqa: BLE001 - MLflow's not-found is one of several exception types: one line
            print(f"show_record.py: --run-id {run_id}: no such run in this MLflow store", file=sys.stderr)
            return 2
    else:
        found = mc.search_runs([e.experiment_id for e in mc.search_experiments()],
                               filter_string=f"tags.`{tracking.RECORD_TAG}` = 'pipeline'",
                               order_by=["attributes.start_time DESC"], max_results=1)
        if not found:
            print("no llmpack pipeline record in this MLflow store", file=sys.stderr)
            return 1
        run = found[0]
    print(f"run {run.info.run_id}  status {run.info.status}")
    print("\n".join(tag_lines(run.data.tags)))
    for key in METRICS:
        value = run.data.metrics.get(key)
        first_pod = key.removesuffix("_s") + "_from_first_pod_s"
        if value is None and first_pod in run.data.metrics:  # timed from the first pod: no submit instant
            key, value = first_pod, run.data.metrics[first_pod]
        print(f"  {key:36} {'-' if value is None else f'{value:.6g}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
