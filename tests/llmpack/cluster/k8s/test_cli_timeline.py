"""``llmpack timeline`` on recorded kubectl dumps, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import REPO, llmpack

FIX = REPO / "tests" / "fixtures" / "k8s"


def test_timeline_json_phases_to_the_second(tmp_path: Path) -> None:
    r = llmpack("cluster", "timeline", "--pods", str(FIX / "pods.json"), "--nodes", str(FIX / "nodes.json"),
                "--events", str(FIX / "events.json"), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["pod"]: row for row in json.loads(r.stdout)}
    kfp = rows["llm-finetune-7tq4m-system-container-impl-1183460071"]
    assert (kfp["orchestrator"], kfp["role"], kfp["step"]) == ("kfp", "executor", "finetune")
    assert (kfp["queue_s"], kfp["provision_s"], kfp["start_s"]) == (207.0, 195.0, 337.0)
    assert kfp["image_pull_s"] == 110.874 and kfp["node_ready"] is not None
    driver = rows["llm-finetune-7tq4m-system-container-driver-2650378426"]
    assert driver["role"] == "driver" and driver["provision_s"] is None
    argo = rows["llm-finetune-x4w8z-finetune-3094715625"]
    assert (argo["orchestrator"], argo["queue_s"], argo["start_s"]) == ("argo", 0.0, 30.0)
    for row in rows.values():
        for key in ("pod", "namespace", "orchestrator", "role", "step", "node", "created", "scheduled", "node_ready",
                    "container_started", "finished", "queue_s", "provision_s", "image_pull_s", "start_s"):
            assert key in row


def test_timeline_bad_dumps_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "pods.json"
    bad.write_text("{\n  oops")
    r = llmpack("cluster", "timeline", "--pods", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "pods.json: line 2" in r.stderr
    empty = tmp_path / "empty.json"
    empty.write_text('{"kind": "List", "apiVersion": "v1", "items": []}')
    r = llmpack("cluster", "timeline", "--pods", str(empty), cwd=tmp_path)
    assert r.returncode == 2 and "empty.json" in r.stderr and "Traceback" not in r.stderr
    r = llmpack("cluster", "timeline", "--pods", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert r.returncode == 2 and "missing.json" in r.stderr


def test_timeline_attributes_an_orchestrator_run_by_its_own_id(tmp_path: Path) -> None:
    """``--run-id`` (and its old name ``--kfp-run``): pods with no llmpack labels join the run group by their run id."""
    pair = "3f2b6c1e-9d4a-4b8e-a1c7-5e0f2d9b8a61=kfp-20250314-090001-1a2b3c"
    base = ("cluster", "timeline", "--pods", str(FIX / "pods.json"), "--run-group", "rg-20250314-085958-7f3a9c",
            "--json")
    alone = {row["pod"] for row in json.loads(llmpack(*base, cwd=tmp_path).stdout)}
    for flag in ("--run-id", "--kfp-run"):
        r = llmpack(*base, flag, pair, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        pods = {row["pod"] for row in json.loads(r.stdout)}
        assert "llm-finetune-7tq4m-system-container-impl-1183460071" in pods - alone, flag
