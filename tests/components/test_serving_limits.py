"""Issue 46 item 16 (and 48's serving part): ``max_new_tokens`` honoured and bounded, prompts bounded, on load
and over HTTP; docs/serving.md's example prints what the page shows.

The quick tests serve an untrained tiny adapter (its answers are the random base model's: long and
never EOS at once, so a shorter ``max_new_tokens`` shows); the slow ones serve it over HTTP and run
the page's example against the default ``llmpack run``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, llmpack

PROMPTS = ["Reverse: apple", "Add: 2+3"]


@pytest.fixture(scope="module")
def servable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained LoRA adapter on tiny with the pyfunc model's files beside it: an MLflow model directory."""
    from components.serving.package import write_servable
    from components.steps.finetune import build_model, save_outputs

    out = tmp_path_factory.mktemp("servable")
    net, _ = build_model("tiny", "lora", lora_r=4, lora_alpha=8)
    save_outputs(out, net, None, method="lora", fused_evaluate=False, meta={"base_model": "tiny", "method": "lora"},
                 tokens_seal="")
    write_servable(out, out)
    return out


@pytest.fixture(scope="module")
def loaded(servable: Path) -> Any:
    import mlflow.pyfunc

    return mlflow.pyfunc.load_model(str(servable))


def _greedy(model_dir: Path, prompts: list[str], max_new_tokens: int) -> list[str]:
    """base + adapter's greedy answers computed here, with llmpack's own tiny model and tokenizer."""
    import torch
    from peft import PeftModel

    from components.training.tiny import EOS_ID, PAD_ID, ByteTokenizer, build_tiny_model

    net, tok, answers = PeftModel.from_pretrained(build_tiny_model(), str(model_dir / "adapter")).eval(), \
        ByteTokenizer(), []
    for prompt in prompts:
        ids = torch.tensor([tok.encode_pair(prompt, "")[0]])
        with torch.no_grad():
            out = net.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=EOS_ID, pad_token_id=PAD_ID)[0, ids.shape[1]:].tolist()
        answers.append(tok.decode(out[: out.index(EOS_ID)] if EOS_ID in out else out))
    return answers


def test_max_new_tokens_in_params_is_honoured_on_load(servable: Path, loaded: Any) -> None:
    short, default = _greedy(servable, PROMPTS, 3), _greedy(servable, PROMPTS, 64)
    assert short != default, "the two lengths give the same answers: the test would prove nothing"
    assert loaded.predict(PROMPTS, params={"max_new_tokens": 3}) == short
    assert loaded.predict(PROMPTS) == default  # the default, 64
    schema = loaded.metadata.get_params_schema()  # declared, so MLflow passes params on (over HTTP too)
    assert [(p.name, p.dtype.name, p.default) for p in schema.params] == [("max_new_tokens", "long", 64)]


@pytest.mark.parametrize(("request_", "expect"), [
    ({"params": {"max_new_tokens": 0}}, "max_new_tokens 0: must be an integer from 1 to 256"),
    ({"params": {"max_new_tokens": 257}}, "max_new_tokens 257: must be an integer from 1 to 256"),
    ({"prompts": ["x" * 64_000]}, "prompt 0: 64,000 characters; at most 4,096"),
    ({"prompts": ["Add: 1+1"] * 65}, "65 prompts in one request; at most 64"),
    ({"prompts": ["Add: 1+1", "y" * 500]}, "prompt 1: 502 tokens plus max_new_tokens 64 exceed the model's "
                                           "context of 512 tokens"),
    ({"prompts": []}, "no prompt in the request"),
])
def test_a_request_over_the_limits_is_one_line_before_any_token(loaded: Any, request_: dict[str, Any],
                                                                 expect: str) -> None:
    from mlflow.exceptions import MlflowException

    began = time.perf_counter()
    with pytest.raises(MlflowException) as caught:
        loaded.predict(request_.get("prompts", PROMPTS), params=request_.get("params"))
    assert caught.value.message == expect and caught.value.error_code == "INVALID_PARAMETER_VALUE"
    assert time.perf_counter() - began < 2.0  # refused before generating (a 64k prompt took 41.5 s)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.slow
def test_mlflow_models_serve_honours_max_new_tokens_over_http(servable: Path, tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("LLMPACK_")}
    env.update(HF_HUB_OFFLINE="1", PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", str(servable),
                               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)], cwd=tmp_path, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5):
                    break
            except OSError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow models serve did not answer /ping in 240 s"
                time.sleep(1)
        status, body = _post(port, {"inputs": PROMPTS, "params": {"max_new_tokens": 3}})
        assert (status, body) == (200, {"predictions": _greedy(servable, PROMPTS, 3)})
        status, body = _post(port, {"inputs": PROMPTS, "params": {"max_new_tokens": 100_000}})
        assert status == 400 and "max_new_tokens 100000: must be an integer from 1 to 256" in body["message"]
        began = time.perf_counter()
        status, body = _post(port, {"inputs": ["x" * 64_000]})
        assert status == 400 and "prompt 0: 64,000 characters; at most 4,096" in body["message"]
        assert time.perf_counter() - began < 10
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _docs_example() -> tuple[str, str]:
    """docs/serving.md's "Load it" example: its Python block and the text block of what it prints."""
    page = (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    section = page.split("## Load it", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    printed = re.search(r"prints:\n\n```text\n(.*?)```", section, re.S)
    assert code and printed, "docs/serving.md's Load it section lost its example or its output"
    return code.group(1), printed.group(1)


@pytest.mark.slow
def test_the_docs_serving_example_prints_what_the_page_shows(tmp_path: Path, mlflow_template_db: Path,
                                                             _session_signing_key_file: Path) -> None:
    """The page's example, run as written after the default `llmpack run` (CPU, seed 0) it names."""
    from tests.conftest import fresh_store

    code, printed = _docs_example()
    uri = fresh_store(mlflow_template_db, tmp_path / "mlflow.db")
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "HF_HUB_OFFLINE": "1",
           "LLMPACK_SIGNING_KEY_FILE": str(_session_signing_key_file)}
    run = llmpack("run", cwd=tmp_path, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == printed, f"docs/serving.md shows {printed!r}; the example printed {r.stdout!r}"
