"""The ninth independent round's breaks (helper-29, issue 46), each replayed: a checkpoint swapped between its
listing and its load, a champion record copied from another store, a trace written through a planted link, GPU
samples planted after a run closed, and a TeX-shaped tag that stopped a report. (Its redirect, redaction and
query-value breaks are replayed in test_rest.py and test_redaction.py.)"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from components.errors import InputError


def _net(fill: float):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 4)
    with torch.no_grad():
        net.weight.fill_(fill)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-3)


def test_a_checkpoint_swapped_after_its_listing_is_refused_at_its_load(tmp_path: Path) -> None:
    """B3: the owner and settings were checked on the manifest the listing read; the load read it again and
    checked only its signature. Another run's signed step-4 swapped in between was restored (weights 7.0)."""
    from components.training import checkpointing as ck
    from components.training.checkpoint_manifest import Untrusted

    mine_root, theirs_root = tmp_path / "run-a" / "finetune", tmp_path / "run-b" / "finetune"
    owner_a, owner_b = {"pipeline_run": "run-a", "step": "finetune"}, {"pipeline_run": "run-b", "step": "finetune"}
    ck.save_checkpoint(mine_root, 4, *_net(1.0), "fp-A", owner=owner_a)
    ck.save_checkpoint(theirs_root, 4, *_net(7.0), "fp-B", owner=owner_b)
    listed = next(ck.checkpoint_candidates(mine_root, "fp-A", owner=owner_a, digests=False))
    os.rename(listed, tmp_path / "spare")
    shutil.copytree(theirs_root / listed.name, listed)  # the race won: run-b's signed step-4 under run-a's name
    target, opt = _net(0.0)
    with pytest.raises(Untrusted):
        ck.load_checkpoint(listed, target, opt, fingerprint="fp-A", owner=owner_a)
    assert float(target.weight.detach().flatten()[0]) == 0.0  # nothing restored
    assert ck.resume_newest(mine_root, "fp-A", *_net(0.0), owner=owner_a) is None  # refused, not resumed


def test_a_champion_record_names_its_versions_run(tmp_path: Path) -> None:
    """B2: the record signed {name, version} only, the same bytes in every store: copied from a store where v1
    was champion to one where v1 was registered with --no-promote, with the alias moved, v1 loaded as champion."""
    from components.serving.signed import UntrustedModel, champion_tags, verified_champion

    tags = champion_tags("m", "1", "run-of-store-1")
    assert verified_champion("m", name="m", version="1", run_id="run-of-store-1", model_tags=tags)["version"] == "1"
    with pytest.raises(UntrustedModel, match="names another run than this version's"):
        verified_champion("m", name="m", version="1", run_id="run-of-store-2", model_tags=tags)


def test_the_trace_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    """B4: ``.trace.otlp.json.tmp`` planted as a link to a user's file: sync's trace write overwrote that file."""
    from components.record import trace_export
    from components.record.trace import Trace

    victim = tmp_path / "victim"
    victim.write_text("the user's own file\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".trace.otlp.json.tmp").symlink_to(victim)
    trace = Trace(trace_id="0" * 32, spans=(), resource={"service.name": "llmpack"})
    out = trace_export.write(trace, run_dir / "trace.otlp.json")
    assert victim.read_text() == "the user's own file\n"
    assert not out.is_symlink() and json.loads(out.read_text())
    (run_dir / "trace.otlp.json").unlink()
    (run_dir / "trace.otlp.json").symlink_to(victim)  # the target itself a link: refused, not followed
    with pytest.raises(InputError):
        trace_export.write(trace, run_dir / "trace.otlp.json")
    assert victim.read_text() == "the user's own file\n"


def test_sync_sends_the_series_sealed_at_close_never_a_planted_sample_file(tmp_path: Path) -> None:
    """B5: a ``llmpack-gpu-planted.jsonl`` anywhere under a sealed run directory was uploaded as the run's GPU
    series: sync walked the tree. Now the curve and series are sealed at close in ``extras.json``."""
    from llmpack.run import orphans

    run_dir = tmp_path / "run"
    (run_dir / "finetune" / "model").mkdir(parents=True)
    (run_dir / "finetune" / "model" / "train_log.jsonl").write_text('{"step": 1, "loss": 2.5}\n')
    digest = orphans.write_extras(run_dir)
    row = {"t": 1.0, "step": "finetune", "gpus": [{"gpu": 0, "util_pct": 99.0, "mem_used_mb": 1.0,
                                                  "mem_total_mb": 2.0}]}
    (run_dir / "x").mkdir()
    (run_dir / "x" / "llmpack-gpu-planted.jsonl").write_text(json.dumps(row) + "\n")
    curve, series = orphans.read_extras(run_dir, digest)
    assert curve == [(1, 2.5)] and series == {}
    (run_dir / orphans.EXTRAS_FILE).write_text(json.dumps({"curve": [[1, 0.1]], "series": {}}))
    with pytest.raises(InputError, match="not the file sealed"):
        orphans.read_extras(run_dir, digest)


def test_a_tex_shaped_tag_is_drawn_as_text_not_parsed(tmp_path: Path) -> None:
    """B7: one planted run whose orchestrator tag was ``$\\undefinedmacro{x}$`` stopped the whole group's report
    with matplotlib's ParseFatalException."""
    from llmpack.compare.comparison import comparison
    from llmpack.report import write_report
    from tests.synthetic_runs import runs

    planted = runs(n=3, paths=("direct", "kfp"))
    for r in planted:
        if r["orchestrator"] == "kfp":
            r["orchestrator"] = "$\\undefinedmacro{x}$"
    out = write_report(comparison("rg-tex", ["direct", "$\\undefinedmacro{x}$"], planted), tmp_path / "rep")
    assert (out / "timeline.png").stat().st_size > 0 and "undefinedmacro" in (out / "report.md").read_text()
