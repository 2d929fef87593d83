"""The thirty-first independent round's findings (helper sec31, issue 46); each test fails on 227a4d5.

F1 ``cluster submit --plan`` takes a named file that resolves to the install's committed artifact as that artifact
(no signature, no private copy), checks the committed file, then sends whatever the typed path names by then: a
stranger's symlink re-pointed after the check is what is sent. F2 a dangling link planted as a dead client's
``<run>.failed`` (a shared runs directory): ``llmpack clean`` / ``sync`` write the take-over's summary, events and
extras into the staging directory, then fail to move it (``Not a directory``, naming neither the link nor what to do)
and refuse it for good after (``it holds a run's summary.json, so its client finished it``): half-written, its record
never closed. F3 a report's default directory, ``llmpack-report/<UTC second>-<run group>``, planted ahead as a dangling
link: ``exists()`` says it is free, ``write_report`` resolves the link and writes the report where the link points
(outside ``llmpack-report``, in any directory of the user's the stranger names)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.components.plan_submit import capture_argo, finetune_gpus, submit
from tests.components.plan_submit import finetune as _finetune

HOST = ["--host", "http://127.0.0.1:9"]
H100 = {"gpu_type": "nvidia-h100-80gb", "capacity": "on-demand", "estimated": True, "chosen": True, "nodes": 1,
        "gpus": 1, "cost_usd": {"total": {"value": 1.0, "ci": [0.5, 2.0]}}}


def _h100_plan(tmp_path: Path) -> Path:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"options": [{**H100, "path": p} for p in ("kfp", "argo", "mlflow")]}))
    return plan


# F1: a link to the committed artifact, re-pointed after the check ---------------------------------------------------

def test_f1_a_link_to_the_committed_artifact_is_not_read_again_after_the_check(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's folder holds ``finetune.yaml``, a link to the install's committed Workflow; the user submits it
    with ``--plan --max-cost``. The committed file is checked (no signature asked: it "is" the shipped one), then the
    link is re-pointed at an 8-GPU Workflow (shown at one point of the window: after the row's cost), and the
    backend reads the typed path again: the 8-GPU file is sent under the 1-GPU row."""
    from llmpack.cluster.plan import record
    from llmpack.compile.artifacts import shipped_artifact

    shipped = shipped_artifact("argo")
    shared = tmp_path / "shared"
    shared.mkdir()
    link = shared / "finetune.yaml"
    link.symlink_to(shipped)
    wf = yaml.safe_load(shipped.read_text())
    for kind in ("requests", "limits"):
        _finetune(wf)["container"]["resources"][kind]["nvidia.com/gpu"] = "8"
    evil = shared / "evil.yaml"
    evil.write_text(yaml.safe_dump(wf, sort_keys=False))

    real_check = record.check_max_cost

    def check_then_repoint(*args: Any, **kwargs: Any) -> None:
        real_check(*args, **kwargs)
        tmp = shared / "tmp-link"
        tmp.symlink_to(evil)
        os.replace(tmp, link)  # the stranger's rename lands here

    sent = capture_argo(monkeypatch)
    monkeypatch.setattr(record, "check_max_cost", check_then_repoint)
    submit(["argo", *HOST, "--workflow", str(link)], _h100_plan(tmp_path))
    gpus = finetune_gpus(sent)
    assert not sent or gpus == ["1"], f"a file that was never checked was sent: finetune asks for {gpus} GPUs"


# F2: a dangling link where the take-over moves the staging directory ----------------------------------------------

RUN = "direct-20261204-000000-abcdef"
IDENTITY = {"run_group": "rg-a", "pipeline_run": RUN, "orchestrator": "direct", "mode": "local", "submitted_at": 1.0}


def _dead_pid() -> int:
    import subprocess
    import sys

    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("command", ["clean", "sync"])
def test_f2_a_dangling_link_as_the_failed_directory_leaves_the_staging_directory_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    from click.testing import CliRunner

    from llmpack.cli import main
    from llmpack.run import orphans

    runs = tmp_path / "runs"
    staging = runs / f".{RUN}.partial"
    (staging / "finetune").mkdir(parents=True)
    orphans.write_owner(staging, identity=IDENTITY, run_id=None, tracking_uri="", tags={}, params={}, pid=_dead_pid())
    before = sorted(p.name for p in staging.iterdir())
    (runs / f"{RUN}.failed").symlink_to(tmp_path / "nowhere")  # the stranger's link: exists() says no
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/x.db")
    monkeypatch.setenv("LLMPACK_TRACKING_MAX_WAIT_S", "3")
    args = ["clean", "--output-dir", str(runs)] if command == "clean" else ["sync", str(staging)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert sorted(p.name for p in staging.iterdir()) == before, (
        f"half-written: the take-over wrote {sorted(set(p.name for p in staging.iterdir()) - set(before))} and then "
        f"could not move the directory ({res.output.strip()[-200:]}); every later clean/sync refuses it")
    assert f"{RUN}.failed" in res.output, f"the line names neither the link nor what to move: {res.output.strip()}"


# F3: a predicted report directory planted as a dangling link ------------------------------------------------------

def test_f3_a_report_is_never_written_where_a_planted_link_points(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import time

    from llmpack.compare import comparison as cmp
    from llmpack.report.target import DEFAULT_REPORTS, write_report_to

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from synthetic_runs import run

    work, victim = tmp_path / "work", tmp_path / "victim"
    work.mkdir()
    victim.mkdir()
    monkeypatch.chdir(work)
    (work / DEFAULT_REPORTS).mkdir()
    now = int(time.time())
    for second in range(now - 2, now + 120):  # the names of the next two minutes, each a link to nowhere yet
        name = time.strftime("%Y%m%d-%H%M%S", time.gmtime(second)) + "-rg-x"
        (work / DEFAULT_REPORTS / name).symlink_to(victim / name)
    result = cmp.comparison("rg-x", ["kfp"], [run("kfp", i, ttfs=30, spinup=10, total=100) for i in range(2)])
    try:
        write_report_to(result, None, {}, force=False)
    except Exception as exc:  # noqa: BLE001 - a refusal is fine; writing through the link is not
        print(f"refused: {exc}")
    assert not list(victim.iterdir()), f"the report was written where a planted link points: {list(victim.iterdir())}"


def test_observation_one_token_stream_at_two_row_lengths_is_two_fingerprints() -> None:
    """Round 31's observation: the fingerprint hashed the token stream's bytes without its shape, so the same stream
    cut into rows of 256 and of 512 resumed each other's checkpoints under an explicit checkpoint_dir."""
    from components.training.checkpointing import run_fingerprint

    stream = bytes(range(256)) * 8
    assert run_fingerprint(["tiny"], stream, shape=(8, 256)) != run_fingerprint(["tiny"], stream, shape=(4, 512))
    assert run_fingerprint(["tiny"], stream, shape=(8, 256)) == run_fingerprint(["tiny"], stream, shape=(8, 256))
