"""The twenty-fourth independent round's findings (helper-52, issue 46); each test failed on d4d08d4, before the fix.

F1 (medium): ``cluster submit --plan --max-cost`` checks the row of the submitted file's GPU type, but not its size:
    a Workflow compiled for 2 nodes run with ``--param nnodes=64`` and ``--max-steps 10,000,000`` (or a file compiled
    for 8 nodes x 8 GPUs) passes a ``--max-cost`` the plan's 2 x 2-GPU, default-steps row fits; the run goes out.
F2 (high): ``cluster submit argo --json`` prints the summary whole: ``tracking_uri`` (its password) and ``host``/``url``
    (the Argo Server's userinfo) unredacted on stdout.
F3 (low-medium): the experiment's artifact location ``http://TRACKING-HOST:443/...`` with the store at
    ``https://TRACKING-HOST`` is taken as "the tracking server's own host": MLflow's HTTP artifact client then sends
    the tracking credentials (Basic / Bearer) in clear text (a scheme downgrade a writer of the store chooses).
F4 (medium): on the kfp and mlflow local paths a step's raw output keeps the user's known secret verbatim in the run
    directory (step logs, kfp.log, the mlflow driver's status file, summary.json's error and llmpack.error); the
    direct and argo paths blank it (the direct/argo cases are the controls and pass).
F5 (low): `cluster submit --workflow FILE --max-steps 10**12` is sent: round 23's bound lives in the shipped
    pipeline's gate, which a named compiled file skips.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner


def _plan(tmp_path: Path) -> tuple[Path, float]:
    """A plan llmpack wrote (argo and kfp on H200, 2 nodes x 2 GPUs, the measured steps); its argo row's cost high."""
    from llmpack.cluster.plan import run
    from llmpack.cluster.plan.history import samples_of_runs
    from tests.llmpack.cluster.plan.plan_runs import history as make_history

    samples = samples_of_runs(make_history({("argo", "nvidia-h200"): {"provision": (20.0, 40.0), "price": 7.9},
                                            ("kfp", "nvidia-h200"): {"provision": (20.0, 40.0), "price": 7.9}}))
    plan = run.plan(samples, run.PlanInputs(capacities=("on-demand",)), today=dt.date(2026, 12, 5)).as_json()
    row = next(o for o in plan["options"] if o["path"] == "argo")
    assert (row["nodes"], row["gpus"]) == (2, 2)  # 2 nodes, 2 GPUs in all (the history's 1 GPU a node)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path, float(row["cost_usd"]["total"]["ci"][1])


@pytest.mark.parametrize("compiled, extra", [
    ((2, 1), ["--param", "nnodes=64"]),
    ((2, 1), ["--max-steps", "10000000"]),
    ((8, 8), []),
], ids=["nnodes-64", "max-steps-10M", "compiled-8x8"])
def test_f1_max_cost_is_checked_against_the_size_that_is_submitted(tmp_path: Path, compiled: tuple[int, int],
                                                                  extra: list[str]) -> None:
    from llmpack.cli import main

    plan, high = _plan(tmp_path)
    nodes, gpus = compiled
    out = tmp_path / "c"
    res = CliRunner().invoke(main, ["compile", "--out", str(out), "--nodes", str(nodes), "--gpus", str(gpus),
                                    "--cache-pvc", "shared", "--gpu-type", "nvidia-h200"])
    assert res.exit_code == 0, res.output
    base = ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--workflow",
            str(out / "argo_workflows/finetune.yaml"), "--plan", str(plan)]
    if compiled == (2, 1):  # the controls: the plan's own size is over a budget below its upper bound, passes above
        res = CliRunner().invoke(main, [*base, "--max-cost", f"{high * 0.9:.2f}"])
        assert res.exit_code == 2 and "--max-cost" in res.output and "not submitted" in res.output, res.output
        res = CliRunner().invoke(main, [*base, "--max-cost", f"{high * 1.1:.2f}"])
        assert "Argo Server at http://127.0.0.1:9 is unreachable" in res.output, res.output
    # a budget the planned 2x2 run fits, for a run 16x its GPUs (or 80,000x its steps): must be refused before sending
    res = CliRunner().invoke(main, [*base, "--max-cost", f"{high * 1.1:.2f}", *extra])
    assert "unreachable" not in res.output, (
        f"--max-cost {high * 1.1:.2f} passed for a run of {nodes}x{gpus} GPUs {extra} against the plan's 2x2 row: "
        f"{res.output.strip()}")
    assert res.exit_code == 2 and "not submitted" in res.output, res.output


def test_f2_cluster_submit_json_prints_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.cli import main
    from tests.standins.argo_server import ArgoServerStandIn
    from tests.standins.mlflow_rest import MlflowRestStandIn

    tracking_pw, argo_pw = "Kx9vQ2mZ7tRw", "ArgoPw5x8Kq2Z"
    for name in ("ARGO_SERVER", "ARGO_TOKEN", "ARGO_NAMESPACE", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    with ArgoServerStandIn(token=None) as argo, MlflowRestStandIn() as mlflow:
        host = argo.url.replace("http://", f"http://argouser:{argo_pw}@")
        tracking = mlflow.url.replace("http://", f"http://alice:{tracking_pw}@")
        res = CliRunner().invoke(main, ["cluster", "submit", "argo", "--json", "--host", host,
                                        "--tracking-uri", tracking])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary.get("mlflow_run_id"), summary  # the record was opened on the stand-in
    assert tracking_pw not in res.output, f"tracking URI's password on stdout: {summary.get('tracking_uri')}"
    assert argo_pw not in res.output, f"Argo host's password on stdout: {summary.get('host')}"


@pytest.mark.parametrize("artifact, store", [
    ("http://mlflow.example:443/api/2.0/mlflow-artifacts/artifacts/1/r/artifacts", "https://mlflow.example"),
    ("http://mlflow.example:8443/api/2.0/mlflow-artifacts/artifacts/1/r/artifacts", "https://mlflow.example:8443"),
], ids=["443", "8443"])
def test_f3_an_artifact_location_that_downgrades_https_to_http_is_refused(artifact: str, store: str) -> None:
    from components.record.artifact_uri import artifact_uri_problem

    # MLflow's HttpArtifactRepository sends get_default_host_creds() (the tracking password or token) to the
    # artifact URI as written: here over plain HTTP, though the user's store is HTTPS
    assert artifact_uri_problem(artifact, store) is not None, "credentials would go in clear text"


_LEAKY = '''
import os, sys
from components import Dataset, Output, pipeline, step
from components.fusion import fused_steps


@step()
def leak(out: Output[Dataset], n: int = 1) -> None:
    pw = os.environ.get("MLFLOW_TRACKING_PASSWORD", "none")
    os.write(2, f"connecting to http://alice:{pw}@127.0.0.1:9/api\\n".encode())  # a library's raw write
    os.write(2, f"error: the store refused {pw}\\n".encode())
    sys.exit(3)


@pipeline(name="leaky")
def leaky(n: int = 1) -> None:
    leak(n=n)


__getattr__ = fused_steps(leaky)
'''


@pytest.mark.parametrize("backend", ["direct", "argo", "kfp", "mlflow"])
def test_f4_a_steps_raw_output_is_redacted_in_the_run_directory_on_every_path(tmp_path: Path, backend: str) -> None:
    """F4 (medium): a step that writes to its file descriptors (a C library, a child process, a step of one's own)
    with the user's MLFLOW_TRACKING_PASSWORD: direct and argo keep only `***` in the run directory (their step logs
    go through `run_logged`); kfp and mlflow keep it raw in `logs/<step>.log`, `logs/kfp.log`, the mlflow driver's
    `llmpack-mlflow-run.json`, and `summary.json`'s `error` and `tags.llmpack.error` (the store's copy is blanked)."""
    import os
    import subprocess
    import sys

    secret = "Qv8-canary-Zt41x"
    (tmp_path / "leaky.py").write_text(_LEAKY)
    env = {**os.environ, "MLFLOW_TRACKING_PASSWORD": secret}
    r = subprocess.run([sys.executable, "-m", "llmpack", "run", "--pipeline", "leaky:leaky", "--backend", backend,
                        "--output-dir", "out", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "step 'leak' failed" in r.stderr, r.stderr
    assert secret not in r.stdout + r.stderr
    leaked = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "out").rglob("*")
                    if p.is_file() and secret.encode() in p.read_bytes())
    assert leaked == [], f"the password in: {leaked}"


def test_f5_max_steps_is_bounded_for_a_named_workflow_too(tmp_path: Path) -> None:
    """F5 (low): round 23 bounded --max-steps at 10,000,000 through the shipped pipeline's gate, which `cluster submit
    --workflow FILE` skips (types only): the shipped pipeline compiled with `--nodes 2` (as the docs ask for a gang)
    went out with max_steps=10**12 (and `--param lr=nan`, `seq_len=4`; no step checks the rules at run time)."""
    from llmpack.cli import main

    out = tmp_path / "c"
    res = CliRunner().invoke(main, ["compile", "--out", str(out), "--nodes", "2", "--cache-pvc", "shared"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--workflow",
                                    str(out / "argo_workflows/finetune.yaml"), "--max-steps", str(10**12)])
    assert "unreachable" not in res.output and "at most 10,000,000" in res.output, res.output


def test_f1_cluster_compare_checks_the_size_it_compiles_too(tmp_path: Path) -> None:
    """F1's twin on `cluster compare --plan`: the row of a 2-node plan against the size the compare compiles."""
    from llmpack.cli import main

    plan, high = _plan(tmp_path)
    base = ["cluster", "compare", "--backends", "argo", "--gpu-type", "nvidia-h200", "--plan", str(plan),
            "--max-cost", f"{high * 1.1:.2f}"]
    for extra, says in ((["--nodes", "16", "--gpus", "8", "--cache-pvc", "c"], "this run is 16 node(s), 128 GPU(s)"),
                        (["--nodes", "2", "--cache-pvc", "c", "--max-steps", "9999"], "this run is 9,999 steps")):
        res = CliRunner().invoke(main, [*base, *extra])
        assert res.exit_code == 2 and says in res.output and "not submitted" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
