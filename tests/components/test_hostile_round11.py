"""The eleventh independent round's breaks (helper-33, issue 46), each replayed: a kubeconfig's schemeless server
userinfo and a failing exec plugin's echo printed by ``cluster doctor``, and the checkpoint root swapped for a link
between its pin check and the write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.errors import InputError

CANARIES = ("Pw7qXYZabc", "ArgSecretCANARY5566bb", "EnvSecretCANARY7788aa", "TokCANARY1122334455")


def _kubeconfig(tmp_path: Path) -> Path:
    plugin = tmp_path / "plugin.sh"
    plugin.write_text('#!/bin/sh\necho "login failed: client secret $MYSECRET rejected (args: $*)" >&2\nexit 1\n')
    plugin.chmod(0o755)
    kc = tmp_path / "kc.yaml"
    kc.write_text(f"""apiVersion: v1
kind: Config
clusters:
- {{name: c, cluster: {{server: "alice:Pw7qXYZabc@127.0.0.1:9"}}}}
- {{name: d, cluster: {{server: "https://127.0.0.1:9"}}}}
users:
- {{name: u, user: {{token: "TokCANARY1122334455"}}}}
- name: e
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: {plugin}
      args: ["--client-secret", "ArgSecretCANARY5566bb"]
      env: [{{name: MYSECRET, value: "EnvSecretCANARY7788aa"}}]
      interactiveMode: Never
contexts:
- {{name: a, context: {{cluster: c, user: u}}}}
- {{name: b, context: {{cluster: d, user: e}}}}
current-context: a
""")
    return kc


@pytest.mark.parametrize("context", ["a", "b"])
@pytest.mark.parametrize("as_json", [False, True])
def test_doctor_prints_no_kubeconfig_secret(tmp_path: Path, context: str, as_json: bool) -> None:
    """R11-1: ``server: alice:PW@127.0.0.1:9`` was printed in the Kubernetes API line (the ':' after the port
    escaped the bare-userinfo rule); R11-2: an exec plugin that fails echoed its env value and args through
    the client's log. The kubeconfig's secrets are now known secrets of the process."""
    from tests.conftest import llmpack

    kc = _kubeconfig(tmp_path)
    r = llmpack("--debug", "cluster", "doctor", "--kubeconfig", str(kc), "--context", context, "--path", "argo",
                *(["--json"] if as_json else []), cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "Kubernetes API" in out
    assert not [c for c in CANARIES if c in out], out[-3000:]


def test_the_checkpoint_root_swapped_after_its_pin_check_gets_nothing_written_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R11-3: a flipper exchanging the pinned root with a link between check_pinned and a path-based mkdtemp
    published signed checkpoints in the link's target (447 in 60 s) and raised FileNotFoundError tracebacks."""
    import torch

    from components import bounded
    from components.training import checkpointing as ck

    root, victim = tmp_path / "run" / "finetune", tmp_path / "victim"
    root.mkdir(parents=True)
    victim.mkdir()
    real_check = bounded.check_pinned

    def check_then_swap(path: object) -> None:  # the race won: right after the check, the root is a link
        real_check(path)
        if Path(str(path)) == root and not root.is_symlink():
            os.rename(root, tmp_path / "run" / "moved")
            root.symlink_to(victim)

    monkeypatch.setattr(bounded, "check_pinned", check_then_swap)
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(net.parameters())
    with bounded.pinned_directories([root]), pytest.raises(InputError, match="moved or replaced"):
        ck.save_checkpoint(root, 1, net, opt, "fp", owner={"pipeline_run": "r", "step": "finetune"})
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("shape", ["alias", "tilde-flag", "tilde-env", "big", "short-arg"])
def test_every_kubeconfig_the_client_loads_has_its_secrets_read_first(tmp_path: Path, shape: str) -> None:
    """Round 12 (helper-35): the round-11 reader skipped a kubeconfig it could not read as strictly as it reads
    its own YAML (an alias anywhere), a path given as `~/kc.yaml` (quoted, or in KUBECONFIG), or one past 4 MiB,
    while the client loaded it and its exec plugin's echo was printed; and `--client-secret Pa55wd7` (too short
    for the value rule) after a secret-named flag."""
    from tests.conftest import llmpack

    home = tmp_path / "home"
    home.mkdir()
    kc = _kubeconfig(tmp_path)
    text = kc.read_text()
    if shape == "alias":
        text = "preferences: {x: &a 1, y: *a}\n" + text
    if shape == "big":
        text = "#" + "x" * (5 << 20) + "\n" + text
    if shape == "short-arg":
        text = text.replace('"ArgSecretCANARY5566bb"', '"Pa55wd7"')
    (home / "kc.yaml").write_text(text)
    env = {**os.environ, "HOME": str(home)}
    where = ["--kubeconfig", str(home / "kc.yaml")]
    if shape == "tilde-flag":
        where = ["--kubeconfig", "~/kc.yaml"]
    if shape == "tilde-env":
        where, env["KUBECONFIG"] = [], "~/kc.yaml"
    r = llmpack("cluster", "doctor", *where, "--context", "b", "--path", "argo", cwd=tmp_path, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Kubernetes API" in out, out[-2000:]
    assert not [c for c in (*CANARIES, "Pa55wd7") if c in out], out[-3000:]
