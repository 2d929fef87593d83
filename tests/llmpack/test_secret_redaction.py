"""A tracking or server URI with a password in it never reaches the output, even malformed, even with --debug.

Each command that takes a URI (``run``, ``report``, ``sync``, ``compare``: ``--tracking-uri``;
``doctor``: ``--kfp-host``) gets one with the canary password ``CANARYPASS`` and a port or host that
cannot be right: ``:50OO``, ``:99999``, an unclosed IPv6 literal, an IPv6 literal with an
out-of-range port and a token in the query. The real CLI runs in a subprocess (as
``tests/llmpack/test_hostile_input.py`` runs it): one line, exit 2, the canary nowhere in stdout or
stderr; with ``llmpack --debug`` (two of the forms, on every command) the traceback is printed too,
and still no canary.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CANARY = "CANARYPASS"
URIS = {
    "port-letters": f"https://alice:{CANARY}@host:50OO",
    "port-99999": f"https://alice:{CANARY}@host:99999",
    "ipv6-unclosed": f"https://alice:{CANARY}@[::1:5000",
    "ipv6-query-token": f"https://[::1]:99999/mlflow?access_token={CANARY}",
}
COMMANDS = {
    "run": lambda uri: ("run", "--tracking-uri", uri, "--output-dir", "runs"),
    "report": lambda uri: ("report", "--run-group", "rg-x", "--tracking-uri", uri, "--out", "report"),
    "sync": lambda uri: ("sync", "runs/rg-x", "--tracking-uri", uri),
    "compare": lambda uri: ("compare", "--tracking-uri", uri, "--output-dir", "runs", "--report", "report"),
    "doctor": lambda uri: ("cluster", "doctor", "--kfp-host", uri),
}
DEBUG_FORMS = ("port-letters", "ipv6-query-token")  # --debug: a traceback each; two forms keep the quick suite quick
CASES = [(cmd, form, debug) for cmd in COMMANDS for form in URIS for debug in (False, True)
         if not debug or form in DEBUG_FORMS]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_", "KFP_", "ARGO_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _run(root: Path, cmd: str, form: str, debug: bool) -> subprocess.CompletedProcess[str]:
    cwd = root / f"{cmd}-{form}-{int(debug)}"
    cwd.mkdir(parents=True)
    argv = [sys.executable, "-m", "llmpack", *(["--debug"] if debug else []), *COMMANDS[cmd](URIS[form])]
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, bool], subprocess.CompletedProcess[str]]:
    """Every case, a few at a time: each is a short-lived process that fails during validation."""
    root = tmp_path_factory.mktemp("redaction")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {case: pool.submit(_run, root, *case) for case in CASES}
        return {case: future.result() for case, future in futures.items()}


@pytest.mark.parametrize(("cmd", "form", "debug"), CASES,
                         ids=[f"{c}-{f}{'-debug' if d else ''}" for c, f, d in CASES])
def test_a_uri_with_a_password_is_one_line_exit_2_and_never_printed(
        cmd: str, form: str, debug: bool,
        observed: dict[tuple[str, str, bool], subprocess.CompletedProcess[str]]) -> None:
    result = observed[(cmd, form, debug)]
    both = result.stdout + result.stderr
    assert CANARY not in both, both
    assert result.returncode == 2, both
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("llmpack: error: ") and result.stdout.strip() == "", both
    flag = "--kfp-host" if cmd == "doctor" else "--tracking-uri"
    assert lines[-1].startswith(f"llmpack: error: {flag} "), lines[-1]
    if debug:
        assert "Traceback (most recent call last)" in result.stderr  # the traceback is there, redacted
    else:
        assert len(lines) == 1, both
