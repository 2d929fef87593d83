"""Errors that name their cause, at once: a hub model that cannot be had, a misspelt backend, a file store.

A hub model the run cannot have is one line before anything starts.

Before this check the tokenize step met an unreachable hub after about 50 s of silent retries
and said only "cannot load its tokenizer (OSError)"; a bare legacy id (``gpt2``) was called "not
a Hugging Face id". The hub here is a closed loopback port (``HF_ENDPOINT``): no test leaves the
machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, llmpack


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: connections are refused


@pytest.fixture()
def no_hub(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return {**env, "HF_HOME": str(tmp_path / "hf-home"), "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}


@pytest.mark.parametrize("model", ["openai-community/gpt2", "gpt2"])
def test_a_hub_model_with_the_hub_unreachable_is_one_line_at_once(model: str, no_hub: dict[str, str],
                                                                 tmp_path: Path) -> None:
    began = time.monotonic()
    r = llmpack("run", "--model", model, "--output-dir", str(tmp_path / "runs"), cwd=tmp_path, env=no_hub)
    took = time.monotonic() - began
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert lines == [f"llmpack: error: model {model}: not in the local Hugging Face cache and the hub is unreachable "
                     f"(ConnectError); download it first (hf download {model}) or give a local model directory"], lines
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()
    assert took < 30, took  # not the ~50 s of retries it took inside a step


def test_a_hub_model_offline_and_not_cached_names_the_setting(no_hub: dict[str, str], tmp_path: Path) -> None:
    r = llmpack("run", "--model", "gpt2", "--output-dir", str(tmp_path / "runs"), cwd=tmp_path,
                env={**no_hub, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2
    assert "not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in r.stderr.strip().splitlines()[-1]


def test_a_cached_hub_model_passes_the_check_without_a_request(no_hub: dict[str, str], tmp_path: Path) -> None:
    """An id whose config.json is in the local cache (the hub's cache layout) is not asked of the hub."""
    repo = Path(no_hub["HF_HOME"]) / "hub" / "models--acme--tiny-lm"
    commit = "0" * 40
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    code = "from components.training.modeling import check_hub_model as c; c('acme/tiny-lm'); print('ok')"
    r = subprocess.run([sys.executable, "-c", code], env=no_hub, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize(("given", "meant"), [("kfpp", "kfp"), ("Argo", "argo"), ("mlfow", "mlflow"), ("KFP", "kfp")])
def test_a_misspelt_backend_gets_the_nearest_name(given: str, meant: str) -> None:
    from components.errors import InputError
    from llmpack.backends import backend

    with pytest.raises(InputError, match=f"did you mean '{meant}'"):
        backend(given)


def test_a_backend_name_far_from_every_one_gets_no_guess() -> None:
    from components.errors import InputError
    from llmpack.backends import backend

    with pytest.raises(InputError) as info:
        backend("airflow")
    assert "did you mean" not in str(info.value)


def test_a_file_store_uri_is_refused_without_recommending_one(tmp_path: Path) -> None:
    """MLflow 3 refuses file stores; the error must not send the user to one."""
    r = llmpack("report", "--run-group", "rg-x", "--tracking-uri", f"file://{tmp_path}/mlruns", cwd=tmp_path)
    line = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2
    assert "no longer opens a file store" in line and "sqlite:///PATH" in line and "file:///PATH" not in line, line
