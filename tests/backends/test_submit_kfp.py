"""``llmpack submit kfp``: the real ``kfp.Client`` against the stand-in KFP API on 127.0.0.1."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest
import yaml
from standins.kfp_api import KFPAPIStandIn

from components.errors import InputError
from kfp_pipelines import submit as kfp_submit
from llmpack.cluster import submit

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "kfp_pipelines" / "finetune.yaml"
TOKEN = "kfp-standin-token"
BAD_TOKEN = "wrong-token-Zq81xT0kenSECRET"
ENV = ("KFP_HOST", "KFP_TOKEN", "KF_PIPELINES_ENDPOINT", "KF_PIPELINES_SA_TOKEN_PATH", "MLFLOW_TRACKING_URI",
       "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME", "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME", "KF_PIPELINES_UI_ENDPOINT",
       "LLMPACK_PRICE_PER_GPU_HOUR")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import kfp

    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    # kfp.Client reads (and may write) ~/.config/kfp/context.json: keep the user's out of it.
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))


@pytest.fixture()
def kfp_api():
    with KFPAPIStandIn(token=TOKEN) as api:
        yield api


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def golden_docs() -> list[dict]:
    return list(yaml.safe_load_all(GOLDEN.read_text(encoding="utf-8")))


def test_submit_sends_the_committed_pipeline_with_run_parameters(kfp_api: KFPAPIStandIn) -> None:
    before = time.time()
    summary = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN,
                                params={"model": "tiny", "data": "builtin", "max_steps": 7, "seed": 3}))
    after = time.time()

    posts = kfp_api.recorded("POST", "/apis/v2beta1/runs")
    assert len(posts) == 1
    body = posts[0].body
    spec, platform = golden_docs()
    # The request IS the compiled artifact: pipeline spec and kfp-kubernetes platform spec, unchanged.
    assert body["pipeline_spec"] == {"pipeline_spec": spec, "platform_spec": platform}
    params = body["runtime_config"]["parameters"]
    assert params == {
        "model": "tiny", "data": "builtin", "max_steps": 7, "seed": 3,
        "submitted_at": summary["submitted_at"], "run_group": summary["run_group"],
        "pipeline_run": summary["pipeline_run"], "orchestrator": "kfp", "mode": "cluster",
    }
    assert before <= summary["submitted_at"] <= after
    assert body["display_name"] == summary["pipeline_run"]
    assert summary["pipeline_run"].startswith("kfp-") and summary["run_group"].startswith("rg-")

    # What the server created is what the summary names.
    (run,) = kfp_api.runs.values()
    assert summary["run_id"] == summary["server_id"] == run["run_id"]
    (exp,) = kfp_api.experiments.values()
    assert (exp["display_name"] == "llmpack"
            and body["experiment_id"] == exp["experiment_id"] == summary["experiment_id"])
    assert summary["mode"] == "cluster" and summary["orchestrator"] == "kfp"
    assert summary["url"].endswith(f"/#/runs/details/{run['run_id']}")
    # Every request carried the token; the experiment was resolved before the clock started.
    assert all(r.authorized for r in kfp_api.requests)
    paths = [(r.method, r.path) for r in kfp_api.requests]
    assert paths[-1] == ("POST", "/apis/v2beta1/runs")
    assert ("POST", "/apis/v2beta1/experiments") in paths
    assert TOKEN not in repr(summary)


def test_second_submit_reuses_the_experiment_and_the_run_group(kfp_api: KFPAPIStandIn) -> None:
    first = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, run_group="rg-compare-1"))
    second = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, run_group="rg-compare-1"))
    assert len(kfp_api.experiments) == 1
    assert first["run_group"] == second["run_group"] == "rg-compare-1"
    assert first["pipeline_run"] != second["pipeline_run"]
    assert first["submitted_at"] < second["submitted_at"]


def test_endpoint_and_token_from_the_environment(kfp_api: KFPAPIStandIn, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("KFP_HOST", kfp_api.url)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token_file))
    summary = kfp_submit.submit(kfp_submit.Request())
    assert summary["host"] == kfp_api.url
    assert all(r.authorized for r in kfp_api.requests)


def test_wait_for_completion_polls_until_the_run_ends(kfp_api: KFPAPIStandIn) -> None:
    summary = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN))
    result = submit.wait_for_completion(summary, token=TOKEN, poll_s=0.01, timeout_s=10)
    assert result["status"] == "succeeded" and result["state"] == "SUCCEEDED"
    assert len(kfp_api.recorded("GET", f"/apis/v2beta1/runs/{summary['run_id']}")) == 3  # PENDING, RUNNING, SUCCEEDED


def test_wait_reports_failure_and_timeout() -> None:
    with KFPAPIStandIn(token=TOKEN, run_states=("PENDING", "RUNNING")) as api:
        summary = kfp_submit.submit(kfp_submit.Request(host=api.url, token=TOKEN))
        stuck = kfp_submit.wait_for_run(summary["run_id"], host=api.url, token=TOKEN, poll_s=0.01, timeout_s=0.2)
        assert stuck["status"] == "timeout" and stuck["state"] == "RUNNING"
        api.set_run_state(summary["run_id"], "FAILED", error="step 'evaluate' failed: quality gate")
        failed = kfp_submit.wait_for_run(summary["run_id"], host=api.url, token=TOKEN, poll_s=0.01, timeout_s=5)
        assert failed["status"] == "failed" and "quality gate" in failed["error"]


def test_bad_token_is_one_line_without_the_token(kfp_api: KFPAPIStandIn, capsys: pytest.CaptureFixture[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    start = time.monotonic()
    with pytest.raises(InputError) as info:
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=BAD_TOKEN))
    message = str(info.value)
    assert "401" in message and "\n" not in message
    assert time.monotonic() - start < 5  # not kfp.Client's 5 x 5 s healthz retries
    out, err = capsys.readouterr()
    for text in (message, out, err, caplog.text):
        assert BAD_TOKEN not in text
    assert not kfp_api.recorded("POST")  # nothing was created


def test_missing_token_against_an_authenticating_server(kfp_api: KFPAPIStandIn) -> None:
    with pytest.raises(InputError, match="401"):
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url))


def test_unreachable_endpoint() -> None:
    port = closed_port()
    start = time.monotonic()
    with pytest.raises(InputError, match=r"unreachable") as info:
        kfp_submit.submit(kfp_submit.Request(host=f"http://127.0.0.1:{port}", token=BAD_TOKEN))
    assert time.monotonic() - start < 5
    assert BAD_TOKEN not in str(info.value) and "\n" not in str(info.value)


def test_no_endpoint_configured() -> None:
    with pytest.raises(InputError, match="no KFP endpoint configured.*KFP_HOST"):
        kfp_submit.submit(kfp_submit.Request(token=TOKEN))


def test_multi_user_namespace() -> None:
    with KFPAPIStandIn(token=TOKEN, multi_user=True, namespaces=("team-a",)) as api:
        with pytest.raises(InputError, match="multi-user: pass --namespace"):
            kfp_submit.submit(kfp_submit.Request(host=api.url, token=TOKEN))
        with pytest.raises(InputError, match="namespace 'team-z'") as info:
            kfp_submit.submit(kfp_submit.Request(host=api.url, token=TOKEN, namespace="team-z"))
        assert "403" in str(info.value)
        summary = kfp_submit.submit(kfp_submit.Request(host=api.url, token=TOKEN, namespace="team-a"))
        (exp,) = api.experiments.values()
        assert exp["namespace"] == "team-a" and summary["namespace"] == "team-a"
        assert api.runs[summary["run_id"]]["experiment_id"] == exp["experiment_id"]


def test_multi_user_namespace_from_the_kfp_context_file() -> None:
    """``kfp``'s own ~/.config/kfp/context.json namespace is used when --namespace is not given."""
    import json

    import kfp

    Path(kfp.Client._LOCAL_KFP_CONTEXT).write_text(json.dumps({"namespace": "team-a"}))
    with KFPAPIStandIn(token=TOKEN, multi_user=True, namespaces=("team-a",)) as api:
        summary = kfp_submit.submit(kfp_submit.Request(host=api.url, token=TOKEN))
        assert summary["namespace"] == "team-a"
        (exp,) = api.experiments.values()
        assert exp["namespace"] == "team-a"


def test_namespace_on_a_single_user_deployment(kfp_api: KFPAPIStandIn) -> None:
    with pytest.raises(InputError, match="single-user deployment: drop --namespace"):
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, namespace="team-a"))


def test_bad_parameters_fail_before_any_request(kfp_api: KFPAPIStandIn) -> None:
    with pytest.raises(InputError, match="unknown pipeline parameter"):
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, params={"max_step": 3}))
    with pytest.raises(InputError, match="max_steps"):
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, params={"max_steps": "many"}))
    with pytest.raises(InputError, match="set by .llmpack cluster submit."):
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, params={"mode": "local"}))
    assert kfp_api.requests == []


def test_server_side_validation_of_parameters(kfp_api: KFPAPIStandIn, tmp_path: Path) -> None:
    """A package whose root declares max_steps as a string: the API server refuses the run (400)."""
    spec, platform = golden_docs()
    spec["root"]["inputDefinitions"]["parameters"]["max_steps"]["parameterType"] = "BOOLEAN"
    package = tmp_path / "pipeline.yaml"
    package.write_text(yaml.safe_dump(spec) + "---\n" + yaml.safe_dump(platform))
    with pytest.raises(InputError, match="400.*max_steps requires type BOOLEAN"):
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, package_path=package,
                                             params={"max_steps": 2}))


def test_mlflow_record_when_a_tracking_uri_is_given(kfp_api: KFPAPIStandIn, tracking_uri: str) -> None:
    from components.record import tracking

    summary = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, tracking_uri=tracking_uri))
    run = tracking.client(tracking_uri).get_run(summary["mlflow_run_id"])
    tags = run.data.tags
    assert tags["llmpack.mode"] == "cluster" and tags["llmpack.orchestrator"] == "kfp"
    assert tags["llmpack.pipeline_run"] == summary["pipeline_run"] and tags["llmpack.run_group"] == summary["run_group"]
    assert tags["llmpack.kfp.run_id"] == summary["run_id"]
    for key in ("llmpack.gpu_type", "llmpack.gpu_count", "llmpack.price_per_gpu_hour", "llmpack.price_source",
                "llmpack.cpu_to_gpu_ratio"):
        assert tags[key]
    assert float(run.data.params["submitted_at"]) == summary["submitted_at"]


def test_a_gang_runs_as_the_launcher_account_and_the_flag_wins(kfp_api: KFPAPIStandIn) -> None:
    """KFP gives a whole run one service account: a package whose finetune is a TrainJob gang runs as
    ``llmpack-launcher`` (the one account its Role lets create the TrainJob); one-node runs keep KFP's own."""
    multinode = REPO / "examples" / "multinode" / "kfp_pipelines" / "finetune.yaml"
    gang = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, package_path=multinode))
    one = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN))
    mine = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKEN, package_path=multinode,
                                                service_account="team-launcher"))
    accounts = [r.body.get("service_account") or None for r in kfp_api.recorded("POST", "/apis/v2beta1/runs")]
    assert accounts == ["llmpack-launcher", None, "team-launcher"]
    assert (gang["service_account"], "service_account" in one, mine["service_account"]) == (
        "llmpack-launcher", False, "team-launcher")
    assert kfp_api.runs[gang["run_id"]]["service_account"] == "llmpack-launcher"
