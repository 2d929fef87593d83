"""The lean path: step processes log to an HTTP tracking server through MLflow's REST API.

Quick, against the stand-in MLflow server (tests/standins/mlflow_rest.py): a real step process
logs its records without importing MLflow; Bearer and Basic credentials as MLflow sends them; TLS
verified by default, with a CA bundle, skipped by name only, and client certificates; the retry
bound (503s retried, a 4xx at once, a dead server given up on in time); MLflow's batch limits.
Slow, against a real ``mlflow server`` on 127.0.0.1: one step's records, and a closing task's
summary, uploaded through the MLflow client and through the REST client land as identical
records (params, tags, run info, every metric's history: values, steps, timestamps).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from standins.mlflow_rest import MlflowRestStandIn

from components import settings
from components.errors import InputError
from components.record import rest, telemetry, tracking
from components.training.modeling import MODEL_META
from tests.backends.test_tls import cert, server_tls  # noqa: F401 - the self-signed certificate fixture

REPO = Path(__file__).resolve().parents[2]
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
              "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_CLIENT_CERT_PATH",
              "MLFLOW_HTTP_REQUEST_TIMEOUT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", *rest.CLIENT_ONLY_ENV)


@pytest.fixture(autouse=True)
def no_tracking_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No tracking setting of the developer's shell, and a HOME without ``~/.mlflow/credentials``."""
    for name in MLFLOW_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _ctx(pipeline_run: str) -> telemetry.RunContext:
    return telemetry.RunContext(run_group="rg-rest", pipeline_run=pipeline_run, orchestrator="argo", mode="cluster",
                                submitted_at=1_700_000_000.125)


def _records(ctx: telemetry.RunContext) -> list[telemetry.Record]:
    """One step's records as a finetune step writes them, a retry's and an awkward float among them."""
    t = ctx.submitted_at
    out = [telemetry.make_record(ctx, "event", "finetune", name, t + 0.7 * (i + 1))
           for i, name in enumerate(("process_started", "model_loaded", "first_step", "finished"))]
    out.append(telemetry.make_record(ctx, "event", "finetune", "process_started", t + 9.1, attempt=1))
    out.append(telemetry.make_record(ctx, "metric", "finetune", "train_s", 1.0 / 3.0))
    out.append(telemetry.make_record(ctx, "metric", "finetune", "tokens_per_s", 12345.678901234567))
    return out


def _upload_records(uri: str, ctx: telemetry.RunContext, records: list[telemetry.Record]) -> int:
    """What the step process's upload does (components.process.runner._upload)."""
    mc = tracking.step_client(uri)
    return tracking.with_retries(lambda: tracking.log_records(mc, tracking.open_pipeline_run(mc, ctx), records),
                                 tracking.upload_retry())


# --------------------------------------------------------------------------- which client


def test_http_store_gets_the_rest_client_other_stores_and_opt_outs_the_mlflow_client(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert isinstance(tracking.step_client("http://127.0.0.1:1"), rest.RestClient)
    assert isinstance(tracking.step_client("https://127.0.0.1:1"), rest.RestClient)
    monkeypatch.setattr(tracking, "client", lambda uri=None: "MlflowClient")  # the switch only: no MLflow import here
    assert tracking.step_client("http://127.0.0.1:1", {settings.TRACKING_REST.name: "0"}) == "MlflowClient"
    assert tracking.step_client("http://127.0.0.1:1", {"MLFLOW_TRACKING_AUTH": "my_plugin"}) == "MlflowClient"
    assert tracking.step_client(f"sqlite:///{tmp_path / 'm.db'}") == "MlflowClient"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    client = tracking.step_client("http://127.0.0.1:1")
    assert isinstance(client, rest.RestClient) and client.timeout_s == 3  # the user's shorter timeout kept
    plugin = tmp_path / "site" / "corp_mlflow_headers-1.0.dist-info"  # a package adding headers to MLflow's requests
    plugin.mkdir(parents=True)
    (plugin / "entry_points.txt").write_text("[mlflow.request_header_provider]\ncorp = corp_headers:Provider\n")
    assert rest.usable("http://127.0.0.1:1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert not rest.usable("http://127.0.0.1:1")


# --------------------------------------------------------------------------- a real step process, no MLflow import


def test_a_step_process_logs_its_records_without_importing_mlflow(tmp_path: Path) -> None:
    with MlflowRestStandIn(authorization="Bearer tok-step-Rk3") as srv:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
        env.update(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=srv.url, MLFLOW_TRACKING_TOKEN="tok-step-Rk3")
        out = tmp_path / "dataset"
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "components.run", "components.steps.prepare_data:prepare_data",
             "--output", f"dataset={out}", "--param", "builtin_size=50", "--param", "pipeline_run=step-no-mlflow",
             "--param", "orchestrator=argo", "--param", "mode=cluster", "--param", f"submitted_at={time.time()}"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "llmpack: warning" not in proc.stderr, proc.stderr[-3000:]
        imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                    if line.startswith("import time:")]
        assert "components.record.rest" in imported
        assert not [m for m in imported if m.split(".")[0] == "mlflow"]
        expected = {r.mlflow_key: r.value for r in telemetry.read_records([out / telemetry.EVENTS_FILE])}
        (run,) = srv.runs.values()
        assert {k: m["value"] for k, m in run["metrics"].items()} == expected and len(expected) >= 3
        assert run["tags"]["llmpack.pipeline_run"] == "step-no-mlflow" and run["tags"]["llmpack.record"] == "pipeline"
        assert {r.auth_scheme for r in srv.requests} == {"Bearer"}


# --------------------------------------------------------------------------- credentials and TLS


def test_basic_credentials_win_over_the_token_as_in_mlflow_and_come_from_the_file_too(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    basic = "Basic " + base64.b64encode(b"ada:s3cret-Pw9").decode()
    with MlflowRestStandIn(authorization=basic) as srv:
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-ignored")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ada")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-Pw9")
        ctx = _ctx("basic-env")
        assert _upload_records(srv.url, ctx, _records(ctx)) == 7
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        creds = tmp_path / "home" / ".mlflow" / "credentials"
        creds.parent.mkdir(parents=True)
        creds.write_text("[mlflow]\nmlflow_tracking_username = ada\nmlflow_tracking_password = s3cret-Pw9\n")
        assert _upload_records(srv.url, _ctx("basic-file"), _records(_ctx("basic-file"))) == 7
        creds.unlink()
        with pytest.raises(rest.RestError) as refused:  # the token alone: refused at once, no retry
            _upload_records(srv.url, _ctx("token-only"), [])
        assert refused.value.status == 401 and "tok-ignored" not in str(refused.value)
        assert srv.recorded()[-1].auth_value == "Bearer tok-ignored"
        assert all(r.auth_value == basic for r in srv.recorded()[:-1])


def test_tls_verified_by_default_trusted_by_ca_path_skipped_by_name_only(
        monkeypatch: pytest.MonkeyPatch, cert: tuple[Path, Path]) -> None:  # noqa: F811 - the imported fixture
    with MlflowRestStandIn(tls=server_tls(cert)) as srv:
        ctx = _ctx("tls")
        with pytest.raises(rest.RestError) as untrusted:  # not retried: a certificate does not get trusted by waiting
            _upload_records(srv.url, ctx, _records(ctx))
        assert untrusted.value.status is None and "MLFLOW_TRACKING_SERVER_CERT_PATH" in str(untrusted.value)
        assert not srv.runs
        monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(cert[0]))
        assert _upload_records(srv.url, ctx, _records(ctx)) == 7
        monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")
        with pytest.raises(InputError, match="set one of them, not both"):
            tracking.step_client(srv.url)
        monkeypatch.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH")
        assert _upload_records(srv.url, ctx, _records(ctx)) == 0  # skipped verification; already logged: nothing new
        monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "maybe")
        with pytest.raises(InputError, match="MLFLOW_TRACKING_INSECURE_TLS='maybe'"):
            tracking.step_client(srv.url)


def test_client_certificate_sent_when_the_server_asks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      cert: tuple[Path, Path]) -> None:  # noqa: F811
    tls = server_tls(cert)
    tls.verify_mode = ssl.CERT_REQUIRED
    tls.load_verify_locations(str(cert[0]))
    both = tmp_path / "client.pem"  # requests' cert=PATH: one file with the certificate and its key
    both.write_text(cert[0].read_text() + cert[1].read_text())
    with MlflowRestStandIn(tls=tls) as srv:
        monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(cert[0]))
        client = tracking.step_client(srv.url)
        with pytest.raises(OSError):  # no client certificate: the handshake is refused
            client.get_experiment_by_name("llmpack")
        monkeypatch.setenv("MLFLOW_TRACKING_CLIENT_CERT_PATH", str(both))
        assert tracking.step_client(srv.url).get_experiment_by_name("llmpack") is None  # spoken to: no such experiment


# --------------------------------------------------------------------------- the retry bound


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def test_retry_bound_5xx_retried_4xx_at_once_dead_server_given_up_in_time() -> None:
    retry = tracking.UploadRetry(max_wait_s=5.0)
    with MlflowRestStandIn() as srv:
        client = rest.RestClient(srv.url)
        srv.fail_next = [503, 429, 500]
        fake = FakeClock()
        assert tracking.with_retries(lambda: client.get_experiment_by_name("llmpack"), retry,
                                     sleep=fake.sleep, clock=fake.clock) is None
        assert fake.sleeps == [0.5, 1.0, 2.0] and len(srv.requests) == 4
        srv.fail_next = [403]
        fake = FakeClock()
        with pytest.raises(rest.RestError) as refused:
            tracking.with_retries(lambda: client.get_experiment_by_name("llmpack"), retry, sleep=fake.sleep,
                                  clock=fake.clock)
        assert refused.value.status == 403 and fake.sleeps == [] and len(srv.requests) == 5
        port = srv.port
    dead = rest.RestClient(f"http://127.0.0.1:{port}", timeout_s=1)
    fake = FakeClock()
    with pytest.raises(tracking.TrackingUnavailable):
        tracking.with_retries(lambda: dead.get_experiment_by_name("llmpack"), retry, sleep=fake.sleep, clock=fake.clock)
    assert fake.sleeps == [0.5, 1.0, 2.0, 1.5] and sum(fake.sleeps) == retry.max_wait_s


def test_log_batch_split_within_mlflow_limits() -> None:
    with MlflowRestStandIn() as srv:
        client = rest.RestClient(srv.url)
        run_id = client.create_run("0", tags={}).info.run_id
        client.log_batch(run_id, metrics=[rest.Metric(f"m{i}", float(i), 1, 0) for i in range(2500)],
                         params=[rest.Param(f"p{i}", str(i)) for i in range(150)],
                         tags=[rest.RunTag(f"t{i}", str(i)) for i in range(30)])
        sizes = [(len(r.body["metrics"]), len(r.body["params"]), len(r.body["tags"]))
                 for r in srv.recorded("POST", "runs/log-batch")]
        assert sizes == [(870, 100, 30), (950, 50, 0), (680, 0, 0)]  # as MlflowClient.log_batch splits them
        data = client.get_run(run_id).data
        assert len(data.metrics) == 2500 and len(data.params) == 150 and len(data.tags) == 30


# --------------------------------------------------------------------------- the same records, byte for byte (slow)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from mlflow_server import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as srv:
        yield srv.uri


def _stored(uri: str, experiment: str, pipeline_run: str) -> dict[str, object]:
    """Everything the store holds of the record, read back through MLflow's own client."""
    mc = tracking.client(uri)
    exp = mc.get_experiment_by_name(experiment)
    (run,) = mc.search_runs([exp.experiment_id], filter_string=f"tags.`llmpack.pipeline_run` = '{pipeline_run}'")
    info = run.info
    return {"params": run.data.params, "tags": run.data.tags,
            "info": (info.status, info.start_time, info.end_time, info.run_name, info.user_id, info.lifecycle_stage),
            "history": {key: [(m.value, m.step, m.timestamp) for m in mc.get_metric_history(info.run_id, key)]
                        for key in run.data.metrics}}


@pytest.mark.slow
def test_client_and_rest_uploads_store_identical_records(mlflow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(f"same-{uuid.uuid4().hex[:8]}")
    records = _records(ctx)
    run = tracking.RunUpload(ctx=ctx, records=records, status="FINISHED", finished_at=ctx.submitted_at + 30.5,
                             metrics={"total_s": 30.375, "eval_loss": 2.0 / 3.0, "mfu": None},
                             tags={**ctx.tags(), "llmpack.gpu_type": "nvidia-l4", "llmpack.status": "succeeded"},
                             params={"submitted_at": repr(ctx.submitted_at), "max_steps": 7})
    stored = {}
    for way, rest_on in (("client", "0"), ("rest", "1")):
        monkeypatch.setenv(settings.TRACKING_REST.name, rest_on)
        monkeypatch.setenv(settings.EXPERIMENT.name, f"exp-{way}-{ctx.pipeline_run}")
        mc = tracking.step_client(mlflow_server)
        assert isinstance(mc, rest.RestClient) == (way == "rest")
        assert _upload_records(mlflow_server, ctx, records[:4]) == 4  # a step process: its records
        assert _upload_records(mlflow_server, ctx, records) == 3  # the next: the new ones only
        _, logged = tracking.upload_run(mc, run, tracking.upload_retry())  # the closing task: the rest, then closed
        assert logged == 0
        assert tracking.upload_run(mc, run, tracking.upload_retry())[1] == 0  # again: nothing new, no second record
        stored[way] = _stored(mlflow_server, f"exp-{way}-{ctx.pipeline_run}", ctx.pipeline_run)
    assert stored["rest"] == stored["client"]
    history = stored["rest"]["history"]
    assert isinstance(history, dict) and len(history) == len(records) + 2  # the records and the two summary metrics
    retry_started = int(max(r.value for r in records[4:] if r.kind == "event") * 1000)  # the batch's latest event
    assert history["metric.finetune.tokens_per_s"] == [(12345.678901234567, 0, retry_started)]


def _register(uri: str, model: Path, metrics: Path, out: Path, name: str,
              **env: str) -> tuple[dict[str, object], list[str]]:
    """The register step as its own process; its registration.json and the modules it imported."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    run_env.update(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri, **env)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "components.run", "components.steps.register:register",
         "--input", f"model={model}", "--input", f"metrics={metrics}", "--output", f"registration={out}",
         "--param", f"model_name={name}", "--param", f"pipeline_run={name}", "--param", "orchestrator=argo",
         "--param", "mode=cluster", "--param", f"submitted_at={time.time()}"],
        env=run_env, cwd=out.parent, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "llmpack: warning" not in proc.stderr, proc.stderr[-3000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return json.loads((out / "registration.json").read_text()), imported


@pytest.mark.slow
def test_register_over_rest_logs_the_same_artifacts_and_version_without_mlflow(mlflow_server: str,
                                                                               tmp_path: Path) -> None:
    from components.serving.sealed import MODEL, sealed_output, verified_model
    from components.serving.signed import SIGNATURE_FILE, sign_evaluation

    weights_bytes = os.urandom(50_000)
    tag = uuid.uuid4().hex[:6]

    def made(way: str) -> tuple[Path, Path]:
        """The model as finetune seals it and its evaluation as evaluate signs it, in pipeline run m-WAY-TAG (a
        run's steps take only its own run's outputs)."""
        run = f"m-{way}-{tag}"
        model, metrics = tmp_path / f"model-{way}", tmp_path / f"metrics-{way}"
        metrics.mkdir()
        with sealed_output(model, MODEL, run, weights="adapter", meta=MODEL_META) as private:
            (private / "adapter" / "nested").mkdir(parents=True)
            (private / MODEL_META).write_text(json.dumps({"method": "lora", "base_model": "tiny"}))
            (private / "adapter" / "adapter_model.safetensors").write_bytes(weights_bytes)
            (private / "adapter" / "nested" / "config.json").write_text('{"r": 8}')
        figures, seal = sign_evaluation({"eval_loss": 1.25, "base_eval_loss": 2.0, "gate_metric": "eval_loss",
                                         "min_improvement": 0.0}, model=verified_model(model, run)["files"],
                                        pipeline_run=run)
        (metrics / "metrics.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")  # as evaluate does
        (metrics / SIGNATURE_FILE).write_text(json.dumps(seal))
        return model, metrics

    got, inputs = {}, {}
    key = {"LLMPACK_SIGNING_KEY_FILE": os.environ["LLMPACK_SIGNING_KEY_FILE"]}  # the key that signed the evaluation
    for way, env in (("client", {settings.TRACKING_REST.name: "0", **key}), ("rest", key)):
        inputs[way] = made(way)
        got[way] = _register(mlflow_server, *inputs[way], tmp_path / f"reg-{way}", f"m-{way}-{tag}", **env)
    assert [m for m in got["rest"][1] if m.split(".")[0] == "mlflow"] == []
    assert [m for m in got["client"][1] if m.split(".")[0] == "mlflow"] != []  # the check can see MLflow's import
    mc = tracking.client(mlflow_server)
    versions = {}
    for way, (record, _) in got.items():
        model, metrics = inputs[way]
        assert record["registered"] is True and record["version"] == "1"
        mv = mc.get_model_version(f"m-{way}-{tag}", "1")
        assert mv.source == record["source"] and mv.run_id == record["run_id"] and mv.status == "READY"
        files = mc.download_artifacts(record["run_id"], "", str(tmp_path / f"down-{way}"))
        stored = {p.relative_to(files).as_posix(): p.read_bytes() for p in Path(files).rglob("*") if p.is_file()}
        weights = {"model/adapter/adapter_model.safetensors":
                   (model / "adapter/adapter_model.safetensors").read_bytes(),
                   "model/adapter/nested/config.json": b'{"r": 8}',
                   f"model/{MODEL_META}": (model / MODEL_META).read_bytes(),
                   "evaluation/metrics.json": (metrics / "metrics.json").read_bytes()}
        assert {k: v for k, v in stored.items() if k in weights} == weights
        # and around the weights, the pyfunc model (components.serving.package): the same files either way
        servable = {"model/MLmodel", "model/pyfunc_model.py", "model/serving.json", "model/requirements.txt",
                    "model/python_env.yaml", "model/conda.yaml", "model/base/config.json",
                    "model/base/generation_config.json", "model/base/model.safetensors"}
        assert set(stored) - set(weights) == servable
        versions[way] = {k: v for k, v in mv.tags.items() if k not in ("llmpack.pipeline_run", "llmpack.run_group",
                                                                       "llmpack.run_id", "llmpack.provenance",
                                                                       "llmpack.provenance.signature")}
        assert str(mc.get_model_version_by_alias(f"m-{way}-{tag}", "champion").version) == "1"
    assert versions["rest"] == versions["client"] and versions["rest"]["llmpack.eval_loss"] == "1.250000"


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed_with_the_users_credentials(code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 9 (B1): a tracking server answering 3xx to another port got the Bearer token and the Basic
    password resent there by urllib's default redirect handler. Now nothing is resent; one line says why."""
    import http.server
    import threading

    seen: list[dict[str, str]] = []

    class Catch(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    catcher = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Catch)

    class Redirect(Catch):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(code)
            self.send_header("Location", f"http://127.0.0.1:{catcher.server_port}{self.path}")
            self.end_headers()

        do_POST = do_GET  # noqa: N815

    redirector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (catcher, redirector):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for env in ({"MLFLOW_TRACKING_TOKEN": "tok-CANARY-b1"},
                    {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "pw-CANARY-b1"}):
            client = rest.RestClient(f"http://127.0.0.1:{redirector.server_port}", env=env, timeout_s=5.0)
            for call in (lambda c=client: c.get_experiment_by_name("llmpack"),
                         lambda c=client: c.call("POST", "runs/create", {"experiment_id": "0"})):
                with pytest.raises(rest.RestError, match=f"HTTP {code} redirect, not followed") as err:
                    call()
                assert err.value.status is None  # not retried either
    finally:
        for server in (catcher, redirector):
            server.shutdown()
    assert seen == []  # the other listener heard nothing: no token, no password, no body
