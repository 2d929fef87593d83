"""The thirteenth independent round's breaks (helper-36, issue 46), replayed on the kubeconfig secrets reader and
the bare-userinfo rule: short values after secret-named exec flags, ``!!binary`` values, odd entry shapes, and
user parts the rule did not take."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest


def _kc(tmp_path: Path, user: str, extra: str = "") -> Path:
    path = tmp_path / "kc.yaml"
    path.write_text(f"apiVersion: v1\nkind: Config\n{extra}clusters:\n- {{name: c, cluster: {{server: "
                    f"'https://127.0.0.1:9'}}}}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- {{name: a, "
                    "context: {cluster: c, user: u}}\ncurrent-context: a\n")
    return path


@pytest.mark.parametrize("args", [["--pass", "Qz7mP2"], ["--pw", "Qz7mP2"], ["--jwt", "Qz7mP2"], ["--otp", "Qz7mP2"],
                                  ["--cookie", "Qz7mP2"], ["--passcode", "Qz7mP2"], ["--pass=Qz7mP2"]])
def test_a_short_value_after_any_secret_named_flag_is_known(tmp_path: Path, args: list[str]) -> None:
    """R13-A1: `--pass Qz7mP2` (and --pw, --jwt, --otp, --cookie, --passcode, `--pass=V`) was not remembered."""
    from components.servers.kube import kubeconfig_secrets

    user = "    exec:\n      command: /bin/false\n      args: " + repr(args).replace("'", '"') + "\n"
    assert "Qz7mP2" in kubeconfig_secrets(str(_kc(tmp_path, user)))


def test_binary_tagged_values_are_known_as_the_plugin_gets_them(tmp_path: Path) -> None:
    """R13-B2: a `!!binary` env value was remembered as "b'...'" and a `!!binary` arg dropped."""
    from components.servers.kube import kubeconfig_secrets

    b64 = base64.b64encode(b"S3cretVal99").decode()
    pw = base64.b64encode(b"Hx8k").decode()
    user = (f"    exec:\n      command: /bin/false\n      env: [{{name: A, value: !!binary {b64}}}]\n"
            f"      args: [\"--password\", !!binary {pw}]\n")
    found = kubeconfig_secrets(str(_kc(tmp_path, user)))
    assert {"S3cretVal99", "Hx8k"} <= found


@pytest.mark.parametrize("extra", ["preferences: {}\nextensions: [1]\n", ""])
def test_odd_entry_shapes_read_as_none_never_a_traceback(tmp_path: Path, extra: str) -> None:
    """R13-A5: an unused cluster `cluster: [1, 2]` or user `auth-provider: "x"` made doctor print a traceback."""
    from components.servers.kube import kubeconfig_secrets

    path = tmp_path / "kc.yaml"
    path.write_text(extra + "clusters:\n- {name: c, cluster: [1, 2]}\n- 7\nusers:\n- {name: u, user: {auth-provider: x,"
                    " exec: {args: 3, env: 4}}}\n- {name: v, user: [1]}\n")
    assert kubeconfig_secrets(str(path)) == set()


@pytest.mark.parametrize("text", [":Pw9x7qZ@127.0.0.1:6443", "alice!:Pw9x7qZ@127.0.0.1:6443",
                                  "bob$:Pw9x7qZ@127.0.0.1:6443", "alice:Pw9'x7qZ@127.0.0.1:6443",
                                  'alice:Pw9"x7qZ@127.0.0.1:6443'])
def test_the_bare_userinfo_rule_takes_any_user_part(text: str) -> None:
    """R13-B1: an empty user (`:TOKEN@host`), a user ending in a sub-delim, a quote in the password."""
    from components.redaction import redact_text, secrets_in

    line = f"llmpack: error: Kubernetes host {text!r} must be an http:// or https:// URL"
    assert "x7qZ" not in redact_text(line, secrets=()), redact_text(line, secrets=())
    assert any("x7qZ" in s for s in secrets_in([], {"LLMPACK_K8S_HOST": text}))
