"""What the hostile rounds on ``cluster submit --plan`` share (rounds 27, 28): a plan of one 1 x H200 row per path,
the artifacts compiled for the H200, a submit against it, and the check that a run was refused, not sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

ROW = {"gpu_type": "nvidia-h200", "capacity": "on-demand", "estimated": True, "chosen": True, "nodes": 1, "gpus": 1,
       "cost_usd": {"total": {"value": 1.0, "ci": [0.5, 2.0]}}}


@pytest.fixture(scope="module", name="compiled")
def compiled_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmpack.cli import main

    out = tmp_path_factory.mktemp("c") / "c"
    res = CliRunner().invoke(main, ["compile", "--out", str(out), "--gpu-type", "nvidia-h200"])
    assert res.exit_code == 0, res.output
    return out


def plan_file(tmp_path: Path) -> Path:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"options": [{**ROW, "path": p} for p in ("kfp", "argo", "mlflow")]}))
    return plan


def submit(args: list[str], plan: Path) -> Any:
    from llmpack.cli import main

    return CliRunner().invoke(main, ["cluster", "submit", *args, "--plan", str(plan), "--max-cost", "3"])


def refused(res: Any, what: str) -> None:
    assert "unreachable" not in res.output, f"{what} sent under a 1 x H200 row: {res.output.strip()[-300:]}"
    assert res.exit_code == 2 and "not submitted" in res.output, res.output[-600:]


def finetune(wf: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in wf["spec"]["templates"] if t.get("name") == "finetune")


def capture_argo(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The Workflows `cluster submit argo` sends, captured instead of sent (rounds 30 and 31: what is sent is what
    was checked)."""
    import argo_workflows.submit as argo_submit

    sent: list[Any] = []

    class Service:
        def create_workflow(self, req: Any, namespace: str) -> Any:
            sent.append(req.workflow)
            raise ConnectionError("captured")

        def close(self) -> None:
            pass

    monkeypatch.setattr(argo_submit, "_service", lambda *a, **k: Service())
    return sent


def finetune_gpus(sent: list[Any]) -> list[str]:
    """The GPU limits of the finetune template of the first Workflow sent."""
    return [str(getattr(q, "root", q)) for t in (sent[0].spec.templates if sent else [])
            if t.name == "finetune" for q in [t.container.resources.limits["nvidia.com/gpu"]]]
