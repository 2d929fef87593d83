"""Issue 52, items 3 and 4: a pipeline of your own keeps its own meaning.

Its signature is the truth for its values (``max_steps: int = 30`` runs 30 steps; a flag for a
parameter it lacks is refused in one line, with the nearest name it has), and ``compare`` judges
what it has: without a ``finetune`` step every round runs it whole and total and its first step's
spin-up are judged, never a time to first step no run can measure.
"""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from components.errors import InputError
from llmpack.cli import main
from llmpack.compare.recommend import recommend
from llmpack.compare.until_decided import Path_, compare_until_decided
from llmpack.run.local import RunOptions
from tests.conftest import llmpack

REPO = Path(__file__).resolve().parents[3]
# The newcomer's pipelines: one without training (its own step, typed), one with its own defaults.
PIPES = '''
import json
from pathlib import Path

from components import Dataset, Input, Metrics, Output, pipeline, step
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.tokenize import tokenize


@step()
def count_rows(dataset: Input[Dataset], counts: Output[Metrics]) -> None:
    """Count the prepared rows."""
    from components.reporting import metric

    rows = (Path(dataset.path) / "train.jsonl").read_text().splitlines()
    metric("train_rows", float(len(rows)))
    (Path(counts.path) / "counts.json").write_text(json.dumps({"train": len(rows)}))


@pipeline(name="no-training")
def no_training(data: str = "builtin", seed: int = 0) -> None:
    prepared = prepare_data(data=data, seed=seed, builtin_size=40)
    count_rows(dataset=prepared.outputs["dataset"])


@pipeline(name="own-defaults")
def own_defaults(model: str = "tiny", data: str = "builtin", seed: int = 3, max_steps: int = 30) -> None:
    prepared = prepare_data(data=data, seed=seed, builtin_size=40)
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model)
    finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=max_steps, seed=seed)


@step()
def shout(dataset: Input[Dataset], shouted: Output[Dataset]) -> None:
    """A data step of one's own between prepare_data and tokenize: the prompts upper-cased, sealed as a split."""
    from components.steps.prepare_data import split_output

    with split_output(shouted) as out:
        for name in ("train.jsonl", "eval.jsonl"):
            rows = [json.loads(line) for line in (Path(dataset.path) / name).read_text().splitlines()]
            (out / name).write_text("".join(json.dumps({**r, "prompt": r["prompt"].upper()}) + "\\n" for r in rows))


@pipeline(name="shouty")
def shouty(seed: int = 0, max_steps: int = 2) -> None:
    prepared = prepare_data(seed=seed, builtin_size=40)
    loud = shout(dataset=prepared.outputs["dataset"])
    tokens = tokenize(dataset=loud.outputs["shouted"], seq_len=32)
    finetune(tokens=tokens.outputs["tokens"], max_steps=max_steps, seed=seed, batch_size=2)


@step()
def check_labels(dataset: Input[Dataset], report: Output[Metrics]) -> None:
    """A step that fails, as a newcomer's first try does."""
    raise ValueError("the data has no column 'label'\\nits second line")


@pipeline(name="fails-in-a-step")
def fails_in_a_step(seed: int = 0) -> None:
    prepared = prepare_data(seed=seed, builtin_size=40)
    check_labels(dataset=prepared.outputs["dataset"])
'''


@pytest.fixture()
def pipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``own_pipes_52`` in a fresh directory, the current one (as a user runs llmpack beside their module)."""
    (tmp_path / "own_pipes_52.py").write_text(PIPES, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "own_pipes_52", raising=False)
    return tmp_path


# --------------------------------------------------------------------------- item 4: the signature is the truth


def test_untyped_flags_take_the_pipelines_own_defaults(pipes: Path) -> None:
    from llmpack.run.user_pipeline import run_values

    assert run_values("own_pipes_52:own_defaults", {}, ()) == {
        "model": "tiny", "data": "builtin", "seed": 3, "max_steps": 30, "params": {}}
    assert run_values("own_pipes_52:own_defaults", {"max_steps": 5}, ())["max_steps"] == 5
    assert run_values(None, {}, ())["max_steps"] == 120  # the shipped pipeline's own
    assert run_values("own_pipes_52:no_training", {}, ()) == {"data": "builtin", "seed": 0, "params": {}}


@pytest.mark.parametrize(("ref", "typed", "items", "expect"), [
    ("own_pipes_52:no_training", {"max_steps": 5}, (),
     "--max-steps: unknown pipeline parameter 'max_steps' (known: data, seed)"),
    ("own_pipes_52:no_training", {"model": "tiny"}, (), "--model: unknown pipeline parameter 'model'"),
    ("own_pipes_52:own_defaults", {}, ("max_step=5",),
     "--param 'max_step': unknown pipeline parameter; did you mean 'max_steps'? (known: model, data, seed, "
     "max_steps)"),
    ("own_pipes_52:own_defaults", {}, ("lr=0.1",), "--param 'lr': unknown pipeline parameter (known: model,"),
    ("own_pipes_52:own_defaults", {"nproc_per_node": 2}, (), "--nproc-per-node: unknown pipeline parameter"),
])
def test_a_flag_for_a_parameter_the_pipeline_lacks_is_one_line(pipes: Path, ref: str, typed: dict, items: tuple,
                                                               expect: str) -> None:
    from llmpack.run.user_pipeline import run_values

    with pytest.raises(InputError) as err:
        run_values(ref, typed, items)
    assert str(err.value).startswith(expect) and "\n" not in str(err.value)


def test_max_steps_zero_is_the_pipelines_rule_too() -> None:
    """The shipped pipeline's rules hold typed flags as they hold --param (one gate, one wording)."""
    from llmpack.run.user_pipeline import run_values

    with pytest.raises(InputError, match=r"^--max-steps: 0 is not allowed; must be a positive number of steps"):
        run_values(None, {"max_steps": 0}, ())


class Captured(Exception):
    pass


def _capture(monkeypatch: pytest.MonkeyPatch, target: str) -> dict[str, Any]:
    """Replace ``target`` (the function a command hands its RunOptions to) with one that keeps them and stops."""
    seen: dict[str, Any] = {}

    def keep(opts: RunOptions, *args: Any, **kwargs: Any) -> None:
        seen["opts"] = opts
        raise Captured

    monkeypatch.setattr(target, keep)
    return seen


def test_run_and_compare_run_the_pipelines_own_max_steps(pipes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmpack run --pipeline mod:fn` with `max_steps: int = 30`: 30 steps, not the CLI's 120; typed wins."""
    seen = _capture(monkeypatch, "llmpack.run.show.run_with_progress")
    CliRunner().invoke(main, ["run", "--pipeline", "own_pipes_52:own_defaults", "--output-dir", str(pipes / "r")])
    assert isinstance(seen["opts"], RunOptions) and (seen["opts"].max_steps, seen["opts"].seed) == (30, 3)
    CliRunner().invoke(main, ["run", "--pipeline", "own_pipes_52:own_defaults", "--max-steps", "7", "--output-dir",
                              str(pipes / "r")])
    assert seen["opts"].max_steps == 7
    seen = _capture(monkeypatch, "llmpack.compare.until_decided.compare")
    CliRunner().invoke(main, ["compare", "--pipeline", "own_pipes_52:own_defaults", "--output-dir", str(pipes / "r"),
                              "--no-report"])
    assert seen["opts"].max_steps == 30


@pytest.mark.parametrize("argv", [
    ["run", "--pipeline", "own_pipes_52:no_training", "--max-steps", "5"],
    ["compare", "--pipeline", "own_pipes_52:no_training", "--max-steps", "5"],
])
def test_run_and_compare_refuse_a_flag_the_pipeline_lacks(pipes: Path, argv: list[str]) -> None:
    result = CliRunner().invoke(main, [*argv, "--output-dir", str(pipes / "r")])
    assert result.exit_code == 2, result.output
    assert result.stderr == ("llmpack: error: --max-steps: unknown pipeline parameter 'max_steps' "
                             "(known: data, seed)\n")
    assert not (pipes / "r").exists()


@pytest.mark.parametrize(("flags", "expect"), [
    (["--gpus", "2"], "--gpus 2: pipeline 'no-training' has no 'finetune' task for it to size"),
    (["--nodes", "2", "--cache-pvc", "shared"], "--nodes 2: pipeline 'no-training' has no 'finetune' task"),
])
def test_compile_refuses_sizing_flags_a_pipeline_cannot_take(pipes: Path, flags: list[str], expect: str) -> None:
    result = CliRunner().invoke(main, ["compile", "--pipeline", "own_pipes_52:no_training", "--out",
                                       str(pipes / "b"), *flags])
    assert result.exit_code == 2 and expect in result.stderr and not (pipes / "b").exists()
    result = CliRunner().invoke(main, ["compile", "--pipeline", "own_pipes_52:own_defaults", "--out",
                                       str(pipes / "b"), "--gpus", "2"])
    assert result.exit_code == 2
    assert "--gpus 2: unknown pipeline parameter 'nproc_per_node' (known: model, data, seed, max_steps)" in \
        result.stderr


def test_a_compiled_custom_pipeline_advertises_its_own_parameters_and_steps(pipes: Path) -> None:
    """Item 8: the MLflow project's header examples and compile's notes are the pipeline's own."""
    result = CliRunner().invoke(main, ["compile", "--pipeline", "own_pipes_52:no_training", "--out", str(pipes / "b")])
    assert result.exit_code == 0, result.output
    assert "finetune" not in result.stderr  # no note about finetune's checkpoints: it has no finetune
    for project in ("finetune", "finetune-k8s"):
        header = "".join(line for line in (pipes / "b" / "mlflow_projects" / project / "MLproject").read_text()
                         .splitlines(keepends=True) if line.startswith("#"))
        assert "max_steps" not in header and "-P data=builtin" in header and "Pipeline 'no-training'\n" in header
    local = (pipes / "b" / "mlflow_projects" / "finetune" / "MLproject").read_text()
    assert "-e prepare_data --env-manager local -P out_dataset=$PWD/data" in local


# --------------------------------------------------------------------------- item 3: compare judges what it has


class WholeRuns:
    """Runs of a pipeline without finetune: spin-up (its first step) and total, no first step; a clock."""

    def __init__(self, total: dict[str, float], *, noise: float = 0.05, seed: int = 0) -> None:
        self.total, self.noise, self.rng = total, noise, random.Random(seed)
        self.now, self.calls = 0.0, []

    def clock(self) -> float:
        return self.now

    def __call__(self, opts: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
        self.calls.append({"backend": opts.backend, "pipe": kw.get("pipe"), "tags": kw.get("tags", {}),
                           "max_steps": opts.max_steps})
        total = self.total[opts.backend] + self.rng.gauss(0, self.noise)
        self.now += total
        return {"pipeline_run": f"{opts.backend}-{len(self.calls)}", "orchestrator": opts.backend, "fuse": opts.fuse,
                "status": "succeeded", "error": None, "mode": "local", "tags": dict(kw.get("tags", {})),
                "metrics": {"spinup_s": 0.4 + total / 100, "total_s": total, "time_to_first_step_s": None}}


def _compare_whole(pipes: Path, total: dict[str, float], budget_s: float, **kw: Any) -> tuple[dict, WholeRuns]:
    fake = WholeRuns(total, **kw)
    paths = [Path_(backend=b, fuse="none") for b in total]
    result = compare_until_decided(RunOptions(pipeline="own_pipes_52:no_training"), paths, run=fake,
                                   run_group="rg-whole", baseline="direct", budget_s=budget_s,
                                   say=lambda line: None, clock=fake.clock)
    return result, fake


def test_a_pipeline_without_training_is_run_whole_every_round_and_judged_on_total(pipes: Path) -> None:
    result, fake = _compare_whole(pipes, {"direct": 3.0, "kfp": 3.02, "argo": 6.0}, budget_s=200.0)
    counted = fake.calls[1:]  # after the uncounted warm-up
    assert all(c["pipe"] is None and c["tags"].get("llmpack.round_kind") == "full" for c in counted)
    assert len({c["tags"]["llmpack.round"] for c in counted}) > 1  # rounds after round 1, each whole
    v = result["verdicts"]
    assert {e["verdict"] for e in v["time_to_first_step_s"].values()} == {"not measured"}
    assert v["total_s"]["argo"]["verdict"] == "slower" and v["total_s"]["kfp"]["verdict"] == "equivalent"
    assert result["stopped"] == "decided" and result["max_steps"] is None  # no --max-steps to suggest
    rec = recommend({**result, "argv": []})
    assert "time to first step" not in " ".join(rec.lines()) and rec.path == "direct"


def test_an_undecided_pipeline_without_training_says_to_decide_on_total_never_first_step(pipes: Path) -> None:
    result, _ = _compare_whole(pipes, {"direct": 3.0, "kfp": 3.4}, budget_s=25.0, noise=0.6, seed=3)
    assert result["stopped"] in ("budget", "max rounds") and result["verdicts"]["total_s"]["kfp"]["verdict"] == \
        "undecided"
    rec = recommend({**result, "argv": []})
    text = " ".join(rec.lines())
    assert rec.command and "to decide: llmpack compare" in text
    assert "time to first step" not in text and "--max-steps" not in text


def test_the_table_shows_what_was_measured_with_its_count(pipes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from llmpack.compare.table import compare_table

    result, _ = _compare_whole(pipes, {"direct": 3.0, "kfp": 3.02, "argo": 6.0}, budget_s=200.0)
    console = Console(width=100, record=True)
    compare_table({**result, "argv": []}, console=console)
    out = console.export_text()
    assert "to 1st step" not in out and "time to first step" not in out and "failed" not in out
    n = result["summary"]["argo"]["total_s"]["n"]
    assert n > 1 and any(line.split()[:2] == ["argo", str(n)] for line in out.splitlines())


def test_a_decided_recommendation_still_says_what_would_decide_the_rest() -> None:
    """Item 1: the budget ran out with verdicts undecided, yet `use direct` came without `to decide:`."""
    from llmpack.compare.comparison import HEADLINES

    verdicts: dict[str, dict[str, Any]] = {}
    for h in HEADLINES:
        base = {"verdict": "baseline", "n": 4, "value": 7.0}
        kfp = {"verdict": h.higher, "n": 4, "rounds": 4, "delta": 2.0, "value": 9.0, "rounds_to_decide": None}
        argo = ({"verdict": "undecided", "n": 4, "rounds": 4, "delta": 0.3, "value": 7.3, "rounds_to_decide": 9}
                if h.metric == "time_to_first_step_s" else dict(kfp))
        if not h.startup:
            kfp = {**kfp, "verdict": "undecided", "n": 1, "rounds": 1}
            argo = {**argo, "verdict": "undecided", "n": 1, "rounds": 1}
        verdicts[h.metric] = {"direct": base, "kfp": kfp, "argo": argo}
    runs = [{"orchestrator": p, "status": "succeeded", "metrics": {"time_to_first_step_s": 7.0}, "tags": {}}
            for p in ("direct", "kfp", "argo")]
    result = {"backends": ["direct", "kfp", "argo"], "baseline": "direct", "runs": runs, "verdicts": verdicts,
              "rounds": 4, "stopped": "budget", "design": {"max_rounds": 12}, "budget_s": 285.0, "argv": [],
              "plan": {"before_rounds_s": 60.0, "round_s": 30.0, "path_round_s": {"direct": 10.0, "kfp": 10.0,
                                                                                 "argo": 10.0}}}
    rec = recommend(result)
    assert rec.path == "direct" and rec.text.startswith("use direct")
    assert rec.command is not None and shlex.split(rec.command)[:3] == ["llmpack", "compare", "--budget"]
    assert any(line.startswith("to decide: llmpack compare --budget") for line in rec.lines())
    assert "argo on time to first step" in (rec.why_command or "")


def test_a_pipeline_without_finetune_records_its_first_steps_spin_up(tmp_path: Path) -> None:
    """``spinup_s`` of a pipeline without finetune is its first step's start (its first pod), never None."""
    from components.record import close
    from components.record.cost import GpuUse
    from components.record.telemetry import Record, RunContext, make_record

    ctx = RunContext(run_group="g", pipeline_run="p", orchestrator="direct", mode="local", submitted_at=100.0)

    def rec(step: str, name: str, value: float) -> Record:
        return make_record(ctx, "event", step, name, value)

    records = [rec("prepare-data", "process_started", 101.5), rec("prepare-data", "finished", 103.0),
               rec("count-rows", "process_started", 103.4), rec("count-rows", "finished", 104.0)]
    uses = [GpuUse(step="prepare-data", gpus=0, cpu=1.0, gpu_type=None),
            GpuUse(step="count-rows", gpus=0, cpu=1.0, gpu_type=None)]
    metrics, _ = close.summarize(ctx=ctx, records=records, uses=uses, price=None, finished_at=104.5, untrained=True)
    assert metrics["spinup_s"] == pytest.approx(1.5) and metrics["time_to_first_step_s"] is None
    metrics, _ = close.summarize(ctx=ctx, records=records, uses=uses, price=None, finished_at=104.5)
    assert metrics["spinup_s"] is None  # a run that failed before finetune: no spin-up, not another step's
    (tmp_path / "llmpack-events.jsonl").write_text("".join(json.dumps(r.__dict__) + "\n" for r in records))
    for status, spinup in (("Succeeded", 1.5), ("Failed", None)):  # what the summarizing task decides it from
        summary = close.close(values={"submitted_at": 100.0, "run_group": "g", "pipeline_run": "p",
                                      "orchestrator": "direct", "mode": "local"}, status=status, uses=[],
                              finished_at=104.5, records_dir=tmp_path, env={"LLMPACK_MLFLOW_LOGGING": "0"})
        assert summary["metrics"]["spinup_s"] == (spinup and pytest.approx(spinup))


@pytest.mark.slow
def test_a_newcomers_pipelines_through_run_and_compare(pipes: Path) -> None:
    """The whole way, small: own defaults run their own 30 steps... here 30 is the pipeline's (tiny model, fast);
    the pipeline without training compares whole every round, judged on total, and says so."""
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    uri = f"sqlite:///{pipes / 'mlflow.db'}"
    r = llmpack("run", "--pipeline", "own_pipes_52:own_defaults", "--json", "--tracking-uri", uri, cwd=pipes, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["params"]["max_steps"] == "30" and s["events"]["finetune"]["first_step"] > 0
    r = llmpack("compare", "--pipeline", "own_pipes_52:no_training", "--backends", "direct,argo", "--budget", "40s",
                "--json", "--no-report", "--tracking-uri", uri, cwd=pipes, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert {e["verdict"] for e in out["verdicts"]["time_to_first_step_s"].values()} == {"not measured"}
    assert out["summary"]["argo"]["total_s"]["n"] >= 2 and out["summary"]["argo"]["spinup_s"]["n"] >= 2
    assert "start-up" not in r.stderr and "time to first step" not in out["recommendation"]["text"]


def test_run_json_has_each_steps_own_metrics(pipes: Path) -> None:
    """The fourth trial: a step's ``metric()`` reached MLflow as metric.<task>.<name> but not ``run --json``."""
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    uri = f"sqlite:///{pipes / 'mlflow.db'}"
    r = llmpack("run", "--pipeline", "own_pipes_52:no_training", "--json", "--tracking-uri", uri, cwd=pipes, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    rows = len((Path(s["artifacts"]["run_dir"]).glob("**/dataset/train.jsonl").__next__()).read_text().splitlines())
    assert s["step_metrics"]["count-rows"] == {"train_rows": float(rows)} and rows > 0
    assert s["step_metrics"]["prepare-data"]["rows"] == 40.0  # a shipped step's own, beside it
    # newcomer5: a pipeline without training listed ~15 training measures as null; only what was measured now
    assert s["metrics"]["total_s"] > 0 and None not in s["metrics"].values(), s["metrics"]
    assert not {"perplexity", "eval_loss", "mfu", "tokens_per_s", "time_to_first_step_s"} & set(s["metrics"])


def test_a_failed_step_is_shown_failed_and_its_error_names_its_log(pipes: Path) -> None:
    """Issue 52: progress said "check_labels done" for the step that raised; the error line did not say where
    its traceback is, and --debug added nothing. Now: "failed", the log named, --debug prints its end."""
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    uri = f"sqlite:///{pipes / 'mlflow.db'}"
    r = llmpack("--debug", "run", "--pipeline", "own_pipes_52:fails_in_a_step", "--tracking-uri", uri, cwd=pipes,
                env=env)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "check-labels failed" in r.stderr and "check-labels done" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("llmpack: error: direct: step 'check-labels' failed: ValueError: the data has no column")
    log = Path(last.rsplit("(its log: ", 1)[1].rstrip(")"))
    assert log.name == "check-labels.log" and "Traceback" in log.read_text()
    assert "the end of " in r.stderr and 'raise ValueError("the data has no column' in r.stderr  # --debug: its end
    assert "no step asks for a GPU: price n/a, no cost" in " ".join(r.stdout.split()) and "eval loss" not in r.stdout


@pytest.mark.slow
def test_a_data_step_of_ones_own_feeds_tokenize_through_split_output(pipes: Path) -> None:
    """The newcomer's third trial: a step between prepare_data and tokenize failed in tokenize ("no
    llmpack-dataset.seal.json"); with split_output it runs, and tokenize read its rows."""
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    uri = f"sqlite:///{pipes / 'mlflow.db'}"
    r = llmpack("run", "--pipeline", "own_pipes_52:shouty", "--json", "--tracking-uri", uri, cwd=pipes, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    run_dir = Path(json.loads(r.stdout)["artifacts"]["run_dir"])
    (shouted,) = run_dir.glob("**/shouted")
    prompts = [json.loads(line)["prompt"] for line in (shouted / "eval.jsonl").read_text().splitlines()]
    assert prompts and all(p == p.upper() for p in prompts)


def test_a_mode_or_margin_the_pipeline_cannot_have_is_one_line(pipes: Path) -> None:
    """The fifth trial: `--fuse gpu` on a pipeline without two GPU steps ran unfused under a fused label, and
    `--margin ttfs=10%` was taken for a pipeline with no time to first step."""
    for argv in (["run", "--pipeline", "own_pipes_52:no_training", "--fuse", "gpu"],
                 ["compile", "--pipeline", "own_pipes_52:no_training", "--fuse", "all", "--out", str(pipes / "o")],
                 ["compare", "--pipeline", "own_pipes_52:no_training", "--backends", "direct,kfp", "--repeats", "2",
                  "--margin", "ttfs=10%"]):
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == 2, (argv, r.output)
        assert r.output.count("\n") == 1 and ("no two consecutive GPU steps" in r.output or "fused_steps" in r.output
                                               or "ttfs (time to first step) is not measured" in r.output), r.output
    assert not (pipes / "o").exists() and not (pipes / "llmpack-runs").exists()


def test_cluster_submit_of_your_compiled_pipeline_tags_its_own_gpus_not_the_shipped_ones(pipes: Path) -> None:
    """newcomer5: ``llmpack cluster submit`` of one's own compiled file tagged the run with the shipped pipeline's
    facts (1x nvidia-h100-80gb, llm-finetune). Each submitter now reads the submitted artifact's own: the close
    task's ``--uses`` (kfp, argo) or pipeline.json's ``uses`` (mlflow), and its pipeline name."""
    from standins.argo_server import ArgoServerStandIn

    from argo_workflows import submit as argo_submit
    from components.record import tracking
    from components.servers.submission import cost_tags
    from kfp_pipelines import submit as kfp_submit
    from llmpack.compile.artifacts import compile_all
    from llmpack.run.user_pipeline import load_pipeline
    from mlflow_projects import submit as mlflow_submit

    out = pipes / "build"
    compile_all(out, load_pipeline("own_pipes_52:no_training"))
    shipped = argo_submit.shipped_pipeline()
    assert cost_tags(shipped, None, None)["llmpack.gpu_count"] == "1"  # what every own file was tagged with
    for compiled in (kfp_submit._compiled(out / "kfp_pipelines" / "finetune.yaml"),
                     argo_submit._compiled(out / "argo_workflows" / "finetune.yaml"),
                     mlflow_submit._compiled(out / "mlflow_projects" / "finetune-k8s")):
        tags = cost_tags(shipped, None, None, compiled=compiled)
        assert (tags["llmpack.gpu_count"], tags["llmpack.gpu_type"], tags["llmpack.pipeline"]) == \
            ("0", "none", "no-training"), tags
    uri = f"sqlite:///{pipes / 'mlflow.db'}"
    with ArgoServerStandIn(token="t0k") as argo:  # the whole submit, as `llmpack cluster submit argo --workflow`
        summary = argo_submit.submit(argo_submit.Request(host=argo.url, token="t0k", tracking_uri=uri,
                                                         workflow_path=str(out / "argo_workflows" / "finetune.yaml")))
    tags = tracking.client(uri).get_run(summary["mlflow_run_id"]).data.tags
    assert tags["llmpack.gpu_count"] == "0" and tags["llmpack.pipeline"] == "no-training", tags
