"""Print the newest llmpack pipeline record in the MLflow store: what any run left, whoever started it.

    python examples/tutorials/show_record.py              # MLFLOW_TRACKING_URI, else ./mlflow.db
    python examples/tutorials/show_record.py RUN_ID       # one record

The record is the MLflow run tagged ``llmpack.record=pipeline``; its metrics and tags were
written by the pipeline's own summarizing task (``components.record``).
"""

from __future__ import annotations

import sys

from components.record import tracking

METRICS = ("spinup_s", "time_to_first_step_s", "total_s", "pipeline_overhead_s", "train_s", "tokens_per_s",
           "eval_loss", "base_eval_loss", "gpu_hours", "cost_usd", "goodput")
TAGS = ("llmpack.orchestrator", "llmpack.pipeline_run", "llmpack.submit_time_source", "llmpack.gpu_type",
        "llmpack.gpu_count", "llmpack.price_per_gpu_hour", "llmpack.price_source", "llmpack.status")


def main(argv: list[str]) -> int:
    mc = tracking.client()
    if argv:
        run = mc.get_run(argv[0])
    else:
        found = mc.search_runs([e.experiment_id for e in mc.search_experiments()],
                               filter_string=f"tags.`{tracking.RECORD_TAG}` = 'pipeline'",
                               order_by=["attributes.start_time DESC"], max_results=1)
        if not found:
            print("no llmpack pipeline record in this MLflow store", file=sys.stderr)
            return 1
        run = found[0]
    print(f"run {run.info.run_id}  status {run.info.status}")
    for key in TAGS:
        print(f"  {key:30} {run.data.tags.get(key, '-')}")
    for key in METRICS:
        value = run.data.metrics.get(key)
        print(f"  {key:30} {'-' if value is None else f'{value:.6g}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
