"""Add your own step to the pipeline, then run, compare or compile it on every path.

From the repository root (docs/your-pipeline.md):

    llmpack run --pipeline examples.custom_step:with_report
    llmpack compare --pipeline examples.custom_step:with_report
    llmpack compile --pipeline examples.custom_step:with_report --fuse all --out build/custom-all
    python examples/custom_step.py build/custom        # the same compile, from Python

A step is a typed function; calling it inside a @pipeline wires it. The same object compiles
to KFP, Argo and MLflow: the new step appears in all three outputs. The one line
``__getattr__ = fused_steps(with_report)`` lets the step processes of a fused run
(``--fuse gpu|all``) find this pipeline's fused steps here, in its own module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from components import Dataset, Input, Metrics, Output, pipeline, step
from components.fusion import fused_steps
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.tokenize import tokenize


@step()
def data_report(dataset: Input[Dataset], report: Output[Metrics], max_rows: int = 5) -> None:
    """Write a small report of the prepared data: row counts and a few examples."""
    meta = json.loads((Path(dataset.path) / "meta.json").read_text())
    rows = (Path(dataset.path) / "train.jsonl").read_text().splitlines()[:max_rows]
    (Path(report.path) / "data_report.json").write_text(json.dumps({"meta": meta, "examples": rows}, indent=2))


@pipeline(name="finetune-with-report")
def with_report(model: str = "tiny", data: str = "builtin", seed: int = 0, max_steps: int = 30) -> None:
    prepared = prepare_data(data=data, seed=seed)
    data_report(dataset=prepared.outputs["dataset"])
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model)
    finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=max_steps, seed=seed)


__getattr__ = fused_steps(with_report)  # this pipeline's fused steps, for their step processes


if __name__ == "__main__":
    from llmpack.compile.artifacts import compile_all

    # Compile the module's own copy (examples.custom_step), not __main__'s: step processes import
    # the steps by that name (the repository root on their PYTHONPATH).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.custom_step import with_report  # noqa: F811

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/custom")
    for path in compile_all(out, with_report()):
        print(path)
