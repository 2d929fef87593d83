"""The thirty-second independent round's findings (helper sec32, issue 46), against round 31's fixes; each test
fails on fb1da5d.

F1 a report's default parent, ``llmpack-report``, planted as a link to a directory of the user's (a shared working
directory, before the first compare): round 31 refuses a link as the report's own name, but the parent is followed,
so the report, its ``latest`` link and its temporary directory are written where the stranger's link points.
F2 a dead client's take-over (``llmpack clean`` / ``sync``) checks the owner file's seal for the staging directory,
then reads and writes everything by path: a stranger who renames a directory of theirs onto ``.<run>.partial`` in
that window (a shared runs directory without the sticky bit, where round 31 already lets them plant
``<run>.failed``) gets their directory's event records sealed with the user's key, for the dead run's MLflow record,
and moved to ``<run>.failed``, where ``sync`` then sends them (the seal's inode is the stranger's directory's, so
the seal holds). F3 the checkpoint fingerprint (round 31 added the rows' shape) still leaves out the labels: one
token stream with another prompt mask is one fingerprint."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

RUN = "direct-20261204-000000-abcdef"
IDENTITY = {"run_group": "rg-a", "pipeline_run": RUN, "orchestrator": "direct", "mode": "local", "submitted_at": 1.0}


def _dead_pid() -> int:
    import subprocess

    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


# F1: the report parent planted as a link -----------------------------------------------------------------------

def test_f1_a_report_is_never_written_through_a_planted_report_parent(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.compare import comparison as cmp
    from llmpack.report.target import DEFAULT_REPORTS, check_report_target, write_report_to

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from synthetic_runs import run

    work, victim = tmp_path / "work", tmp_path / "victim"
    work.mkdir()
    victim.mkdir()
    monkeypatch.chdir(work)
    (work / DEFAULT_REPORTS).symlink_to(victim)  # the stranger's link, planted before the user's first compare
    result = cmp.comparison("rg-x", ["kfp"], [run("kfp", i, ttfs=30, spinup=10, total=100) for i in range(2)])
    try:
        check_report_target(None, "--report-dir", force=False)
        write_report_to(result, None, {}, force=False)
    except Exception as exc:  # noqa: BLE001 - a refusal is fine; writing through the link is not
        print(f"refused: {exc}")
    assert not list(victim.iterdir()), f"written where a planted parent link points: {list(victim.iterdir())}"


# F2: the staging directory swapped after its owner's seal was checked --------------------------------------------

@pytest.mark.xfail(strict=True, reason="open (issue 46, round 32 F2): the take-over checks the owner's seal, then "
                   "reads and writes by path; a directory swapped in between is sealed (descriptor-relative writes)")
def test_f2_a_take_over_seals_only_the_directory_whose_owner_it_checked(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from components.record import telemetry
    from llmpack.run import orphans

    runs = tmp_path / "runs"
    staging = runs / f".{RUN}.partial"
    (staging / "finetune").mkdir(parents=True)
    orphans.write_owner(staging, identity=IDENTITY, run_id="0123456789abcdef0123456789abcdef", tracking_uri="",
                        tags={}, params={}, pid=_dead_pid())
    mine = os.lstat(staging).st_ino
    stranger = runs / "stranger"
    (stranger / "finetune").mkdir(parents=True)
    planted = {"key": "eval_loss", "kind": "metric", "step": "evaluate", "name": "eval_loss", "value": 0.0001,
               "run_group": "rg-a", "pipeline_run": RUN, "orchestrator": "direct", "mode": "local", "attempt": 0}
    (stranger / "finetune" / telemetry.EVENTS_FILE).write_text(json.dumps(planted) + "\n")

    real_holders = orphans.holders
    swapped: list[bool] = []

    def holders_then_swap(directory: Path) -> list[int]:  # the window after read_owner checked the seal
        if not swapped:
            swapped.append(True)
            os.rename(staging, runs / "mine-moved-away")
            os.rename(stranger, staging)  # the stranger's rename lands here
        return real_holders(directory)

    monkeypatch.setattr(orphans, "holders", holders_then_swap)
    try:
        kept = orphans.take_over(staging, wait_s=0)
    except Exception as exc:  # noqa: BLE001 - a refusal is fine; sealing the stranger's directory is not
        print(f"refused: {exc}")
        return
    summary = json.loads((kept / "summary.json").read_text())
    orphans.check_seal(kept, summary, kept / "summary.json")  # what sync checks: it passes
    events = (kept / "events.jsonl").read_text()
    assert os.lstat(kept).st_ino == mine and "eval_loss" not in events, (
        "the stranger's directory was sealed with the user's key as the dead run's, for MLflow run "
        f"{summary['artifacts']['mlflow_run_id']}, its planted records with it: {events.strip()[:200]}")


# F3: the checkpoint fingerprint leaves the labels out ------------------------------------------------------------

def test_f3_the_checkpoint_fingerprint_holds_the_labels_too() -> None:
    """Round 31 added the token rows' shape to the fingerprint; the rows' ``labels`` (which tokens are trained on:
    prompt tokens masked -100) are still left out. Two data sets whose packed token streams are equal but whose
    prompt/response split differs (``prompt "A B" -> "C"`` against ``"A" -> "B C"``: another data set, another
    training) are one fingerprint, so a rerun under an explicit ``checkpoint_dir`` resumes the other's checkpoint.
    Read from ``finetune``'s own call (a run of the step needs a sealed tokenize output and a model)."""
    import ast
    import inspect

    from components.steps import finetune as step

    tree = ast.parse(inspect.getsource(step))  # the module: finetune is a Step object, its function inside
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_fingerprint"]
    assert calls, "finetune no longer calls run_fingerprint"
    names = {n.id for call in calls for n in ast.walk(call) if isinstance(n, ast.Name)}
    assert "labels" in names, (f"the fingerprint reads {sorted(names)}: not the labels, so two data sets of one token "
                               "stream and other prompt masks resume each other's checkpoints")
