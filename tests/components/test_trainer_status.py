"""TrainJob progress: rank 0 posts progress, ETA, loss and the time to first step to the Trainer's status server.

Against a loopback https stand-in of the status server (its own CA, a projected-token file), with
the stdlib client the step uses; a missing, refusing or unreachable endpoint never fails training.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standins.tls import self_signed, server_tls
from standins.trainer_status import TrainerStatusStandIn

from components.training.progress import ProgressFile
from components.training.trainer_status import CA_ENV, TOKEN_ENV, URL_ENV, TrainerStatus

TOKEN = "projected-sa-token-Jq83Lx"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("status-tls"))


@pytest.fixture()
def env(cert: tuple[Path, Path], tmp_path: Path) -> Iterator[tuple[dict[str, str], TrainerStatusStandIn]]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with TrainerStatusStandIn(token=TOKEN, tls=server_tls(cert)) as server:
        yield {URL_ENV: server.url + "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/tj/status",
               CA_ENV: str(cert[0]), TOKEN_ENV: str(token_file)}, server


def _train(progress: ProgressFile, steps: int, step_s: float = 0.0, server: TrainerStatusStandIn | None = None) -> None:
    for done in range(1, steps + 1):
        time.sleep(step_s)
        progress.update(done, tokens=done * 128, elapsed_s=done * 0.5, loss=4.0 / done)
        if done == 1 and server is not None:  # a real step takes seconds: the first post goes out before the next
            deadline = time.monotonic() + 10.0
            while not server.statuses and time.monotonic() < deadline:
                time.sleep(0.01)
    progress.close()


def _metrics(status: dict) -> dict[str, str]:
    return {m["name"]: m["value"] for m in status.get("metrics", [])}


def test_first_and_last_steps_are_posted_with_loss_eta_and_time_to_first_step(
        env: tuple[dict[str, str], TrainerStatusStandIn], tmp_path: Path) -> None:
    settings, server = env
    submitted = time.time() - 42.0
    progress = ProgressFile(tmp_path / "p.json", start_step=0, max_steps=20, status=TrainerStatus.from_env(settings),
                            submitted_at=submitted)
    _train(progress, 20, server=server)  # without the wait, a loaded machine let the last supersede the first unsent
    first, last = server.statuses[0], server.statuses[-1]
    assert len(server.statuses) == 2  # throttled to one post per 5 s: only the forced first and last went out
    assert first["progressPercentage"] == 5 and last["progressPercentage"] == 100
    assert first["estimatedRemainingSeconds"] == 10 and last["estimatedRemainingSeconds"] == 0
    assert _metrics(first)["loss"] == "4" and _metrics(last)["loss"] == "0.2" and _metrics(last)["step"] == "20"
    assert 42.0 <= float(_metrics(first)["time_to_first_step_s"]) < 60.0
    assert _metrics(first)["time_to_first_step_s"] == _metrics(last)["time_to_first_step_s"]
    assert all(r.authorized for r in server.recorded("POST"))  # the token file's token, over the CA's TLS


def test_updates_between_are_throttled_not_dropped_for_good(env: tuple[dict[str, str], TrainerStatusStandIn],
                                                           tmp_path: Path) -> None:
    settings, server = env
    status = TrainerStatus.from_env(settings)
    assert status is not None
    status.every_s = 0.05
    progress = ProgressFile(tmp_path / "p.json", start_step=0, max_steps=10, status=status)
    for done in range(1, 11):  # each step waits until the sender has taken what was queued, as a real step's
        time.sleep(0.03)       # seconds would: a slow first post (TLS on a loaded machine) superseded all between
        progress.update(done, tokens=done * 128, elapsed_s=done * 0.5, loss=4.0 / done)
        deadline = time.monotonic() + 10.0
        while status._pending is not None and time.monotonic() < deadline:
            time.sleep(0.005)
    progress.close()
    percents = [s["progressPercentage"] for s in server.statuses]
    assert percents[0] == 10 and percents[-1] == 100 and 3 <= len(percents) <= 10 and percents == sorted(percents)
    assert "time_to_first_step_s" not in _metrics(server.statuses[0])  # no submit time known: not made up


def test_no_status_url_means_no_reporter() -> None:
    assert TrainerStatus.from_env({}) is None and TrainerStatus.from_env({URL_ENV: "  "}) is None


@pytest.mark.parametrize("failure", ["refused", "http-500", "bad-token", "untrusted-ca", "closed-port"])
def test_a_failing_status_server_never_fails_or_stalls_training(
        failure: str, env: tuple[dict[str, str], TrainerStatusStandIn], tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    settings, server = env
    if failure == "http-500":
        server.fail_with = 500
    elif failure == "refused":
        server.fail_with = 403
    elif failure == "bad-token":
        Path(settings[TOKEN_ENV]).write_text("someone-else")
    elif failure == "untrusted-ca":
        settings = {**settings, CA_ENV: str(self_signed(tmp_path / "other-ca")[0])}
    else:
        settings = {**settings, URL_ENV: "https://127.0.0.1:9/status"}
    status = TrainerStatus.from_env(settings)
    progress = ProgressFile(tmp_path / "p.json", start_step=0, max_steps=50, status=status)
    t0 = time.monotonic()
    for done in range(1, 51):
        progress.update(done, tokens=done, elapsed_s=float(done), loss=1.0)
    loop_s = time.monotonic() - t0
    progress.close()
    assert loop_s < 1.0  # the loop never waited on the network
    assert server.statuses == [] and status is not None and status.failures >= 1 and status.sent == 0
    warnings = [line for line in capfd.readouterr().err.splitlines() if "Trainer status server" in line]
    assert len(warnings) == 1 and "training goes on" in warnings[0]  # said once, not per step
    assert TOKEN not in warnings[0]


def _finetune(tokens: Path, root: Path, settings: dict[str, str]) -> str:
    import os

    from tests.conftest import SIX_STEPS, TUNE, run_step

    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1", **settings}
    r = run_step(TUNE, f"--input=tokens={tokens}", f"--output=model={root / 'model'}", *SIX_STEPS, cwd=root, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stderr


@pytest.mark.slow  # a real finetune step process (~20 s)
def test_the_finetune_step_posts_its_progress_to_the_trainjob(env: tuple[dict[str, str], TrainerStatusStandIn],
                                                              tokens: Path, tmp_path: Path) -> None:
    """The real step, as rank 0 of a TrainJob whose controller injected the status variables."""
    import json

    settings, server = env
    _finetune(tokens, tmp_path, settings)
    assert server.statuses[0]["progressPercentage"] == 16 and server.statuses[-1]["progressPercentage"] == 100
    losses = [json.loads(line)["loss"] for line in (tmp_path / "model" / "train_log.jsonl").read_text().splitlines()]
    assert float(_metrics(server.statuses[-1])["loss"]) == pytest.approx(losses[-1], rel=1e-5)


@pytest.mark.slow
def test_the_finetune_step_trains_on_when_the_status_server_is_gone(tokens: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    err = _finetune(tokens, tmp_path, {URL_ENV: "https://127.0.0.1:9/status", TOKEN_ENV: str(token)})
    assert (tmp_path / "model" / "train_log.jsonl").read_text().count("\n") == 6
    assert err.count("Trainer status server did not take progress") == 1
