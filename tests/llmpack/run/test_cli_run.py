"""``llmpack run --backend direct``: the whole pipeline end to end, and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import llmpack

METRICS = ("spinup_s", "time_to_first_step_s", "pipeline_overhead_s", "total_s", "train_s", "tokens_per_s",
           "eval_loss", "base_eval_loss", "perplexity", "gpu_hours", "cost_usd", "usd_per_1m_tokens", "goodput")
TAGS = ("llmpack.run_group", "llmpack.pipeline_run", "llmpack.orchestrator", "llmpack.mode", "llmpack.gpu_type",
        "llmpack.gpu_count", "llmpack.price_per_gpu_hour", "llmpack.price_source", "llmpack.cpu_to_gpu_ratio")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("cli")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out = []
    for _ in range(2):
        r = llmpack("run", "--backend", "direct", "--max-steps", "20", "--json", "--tracking-uri", uri, cwd=root)
        assert r.returncode == 0, r.stderr
        out.append(json.loads(r.stdout))
    return root, out


@pytest.mark.slow
def test_direct_run_summary_and_mlflow_record(two_runs: tuple[Path, list[dict]]) -> None:
    root, (s, _) = two_runs
    assert s["orchestrator"] == "direct" and s["mode"] == "local" and s["status"] == "succeeded"
    m = s["metrics"]
    for key in METRICS:
        assert m[key] is not None, key
    assert m["time_to_first_step_s"] > m["spinup_s"] > 0
    assert m["eval_loss"] < m["base_eval_loss"]
    price = float(s["tags"]["llmpack.price_per_gpu_hour"])
    assert m["cost_usd"] == pytest.approx(m["gpu_hours"] * price)
    assert Path(s["artifacts"]["model_dir"], "adapter", "adapter_model.safetensors").exists()
    assert Path(s["artifacts"]["events_file"]).exists()
    assert not list(Path(s["artifacts"]["run_dir"]).parent.glob(".*partial"))

    from mlflow.tracking import MlflowClient

    run = MlflowClient(s["artifacts"]["tracking_uri"]).get_run(s["artifacts"]["mlflow_run_id"])
    for key in TAGS:
        assert run.data.tags[key] == s["tags"][key]
    for key in ("spinup_s", "time_to_first_step_s", "cost_usd", "eval_loss"):
        assert run.data.metrics[key] == pytest.approx(m[key])
    assert "event.finetune.first_step" in run.data.metrics
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_same_seed_gives_byte_identical_adapters(two_runs: tuple[Path, list[dict]]) -> None:
    _, (a, b) = two_runs
    wa = Path(a["artifacts"]["model_dir"], "adapter", "adapter_model.safetensors").read_bytes()
    wb = Path(b["artifacts"]["model_dir"], "adapter", "adapter_model.safetensors").read_bytes()
    assert wa == wb
    assert a["metrics"]["eval_loss"] == b["metrics"]["eval_loss"]


def _bad(tmp_path: Path, *args: str) -> str:
    r = llmpack("run", *args, "--output-dir", str(tmp_path / "runs"),
                "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmpack: error: "), r.stderr
    assert not (tmp_path / "runs").exists(), "nothing may be written for bad input"
    return lines[0]


def test_bad_inputs_one_line_exit_2_nothing_written(tmp_path: Path) -> None:
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text('{"prompt": "a", "response": "b"}\n{oops\n')
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"prompt": "a"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    notmodel = tmp_path / "notmodel"
    notmodel.mkdir()
    assert "malformed.jsonl:2: malformed JSON" in _bad(tmp_path, "--data", str(malformed))
    assert "missing.jsonl:1: missing field 'response'" in _bad(tmp_path, "--data", str(missing))
    assert "empty.jsonl: no rows" in _bad(tmp_path, "--data", str(empty))
    assert "nope.jsonl: no such file" in _bad(tmp_path, "--data", "nope.jsonl")
    assert "not a model directory (no config.json)" in _bad(tmp_path, "--model", str(notmodel))
    assert "--max-steps: 0 is not allowed" in _bad(tmp_path, "--max-steps", "0")
    assert "--max-steps: -3 is not allowed" in _bad(tmp_path, "--max-steps", "-3")
    assert "--gpus -1" in _bad(tmp_path, "--gpus", "-1")
    assert "price 'cheap' is not a number" in _bad(tmp_path, "--price-per-gpu-hour", "cheap")
    assert "--backend 'nosuch'" in _bad(tmp_path, "--backend", "nosuch")
    assert "no known price" in _bad(tmp_path, "--gpu-type", "acme-x1000")
    assert "'abc' is not a valid integer" in _bad(tmp_path, "--max-steps", "abc")


def test_output_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    r = llmpack("run", "--output-dir", str(f), cwd=tmp_path)
    assert r.returncode == 2 and "exists and is not a directory" in r.stderr and f.read_text() == "x"


def test_help_is_fast_and_lists_commands(tmp_path: Path) -> None:
    r = llmpack("--help", cwd=tmp_path)
    assert r.returncode == 0
    for cmd in ("run", "compile"):
        assert cmd in r.stdout


def test_flags_cannot_be_bypassed_through_param_and_ids_are_checked(tmp_path: Path) -> None:
    assert "--param max_steps: use --max-steps" in _bad(tmp_path, "--param", "max_steps=0")
    assert "--param data: use --data" in _bad(tmp_path, "--param", "data=x.jsonl")
    assert "--run-group 'Bad_Group'" in _bad(tmp_path, "--run-group", "Bad_Group")
    assert "--seed -1" in _bad(tmp_path, "--seed", "-1")
    r = llmpack("report", "--run-group", "a'b", cwd=tmp_path)
    assert r.returncode == 2 and "DNS-1123" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_the_first_version_is_champion_and_the_same_run_again_ties_and_stays_challenger(
        two_runs: tuple[Path, list[dict]]) -> None:
    root, (a, b) = two_runs
    assert a["promotion"].startswith("version 1 -> champion (no champion yet; eval_loss ")
    loss = f"{a['metrics']['eval_loss']:.6g}"
    assert b["promotion"] == f"version 2 stays challenger (tied v1: {loss} = {loss})"  # same seed, same weights
    # --no-promote, and the line a person reads last
    r = llmpack("run", "--backend", "direct", "--max-steps", "2", "--no-promote", "--tracking-uri",
                a["artifacts"]["tracking_uri"], cwd=root)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]  # one last line: the task outcome, then the registry's decision
    assert (last.startswith("outcome: exact match base ")
            and last.endswith("; version 3 stays challenger (promote=false)"))

    from mlflow.tracking import MlflowClient

    mc = MlflowClient(a["artifacts"]["tracking_uri"])
    assert str(mc.get_model_version_by_alias("llmpack-finetuned", "champion").version) == "1"
    assert str(mc.get_model_version_by_alias("llmpack-finetuned", "challenger").version) == "3"
