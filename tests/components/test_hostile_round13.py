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
    assert kubeconfig_secrets(str(path)) <= {"x", "3", "4"}  # read (short ones are never blanked), no traceback


@pytest.mark.parametrize("text", [":Pw9x7qZ@127.0.0.1:6443", "alice!:Pw9x7qZ@127.0.0.1:6443",
                                  "bob$:Pw9x7qZ@127.0.0.1:6443", "alice:Pw9'x7qZ@127.0.0.1:6443",
                                  'alice:Pw9"x7qZ@127.0.0.1:6443'])
def test_the_bare_userinfo_rule_takes_any_user_part(text: str) -> None:
    """R13-B1: an empty user (`:TOKEN@host`), a user ending in a sub-delim, a quote in the password."""
    from components.redaction import redact_text, secrets_in

    line = f"llmpack: error: Kubernetes host {text!r} must be an http:// or https:// URL"
    assert "x7qZ" not in redact_text(line, secrets=()), redact_text(line, secrets=())
    assert any("x7qZ" in s for s in secrets_in([], {"LLMPACK_K8S_HOST": text}))


@pytest.mark.parametrize("host", ["a" * 70 + ":Pw9x7qZ@127.0.0.1:6443", "alice:" + "Ab1" * 90 + "@127.0.0.1:6443",
                                  "alice:Qz7 mP2@127.0.0.1:6443", "https://alice:Qz7 mP2xy@127.0.0.1:6443"])
def test_round14_a_handed_userinfo_of_any_length_or_with_a_space_is_known(host: str) -> None:
    """R14-B1, B2: a user over 64 characters, a password over 256, or a space in the password (with or without a
    scheme) handed in the environment or argv was neither known nor blanked."""
    from components.redaction import redact_text, secrets_in

    password = host.rsplit("@", 1)[0].split("//")[-1].split(":", 1)[1]
    for handed in (secrets_in([], {"LLMPACK_K8S_HOST": host}), secrets_in(["llmpack", "--host", host], {})):
        assert password in handed
        out = redact_text(f"llmpack: error: Kubernetes host {host!r} must be an http:// or https:// URL",
                          secrets=handed)
        assert password not in out and "Qz7" not in out and "Pw9x7qZ" not in out, out


def test_round14_every_value_of_a_kubeconfig_user_is_known_and_its_token_file_bounded(tmp_path: Path) -> None:
    """R14-B3: `-p Qz7mP2x`, `--pin 482915`, `-P pizzapie` (short or unnamed flags) and a field the client quotes
    in its error were printed; R14-B4: `tokenFile: /dev/zero` was read by the client without a bound."""
    from components.errors import InputError
    from components.servers.kube import kubeconfig_secrets

    user = ("    pin: '731234'\n    exec:\n      command: get-creds\n"
            "      args: ['-p', 'Qz7mP2x', '--pin', '482915', '-P', 'pizzapie']\n")
    assert {"Qz7mP2x", "482915", "pizzapie", "731234"} <= kubeconfig_secrets(str(_kc(tmp_path, user)))
    with pytest.raises(InputError, match="tokenFile '/dev/zero'"):
        kubeconfig_secrets(str(_kc(tmp_path, "    tokenFile: /dev/zero\n")))
    token = tmp_path / "token"
    token.write_text("tokFILE77aa\n")
    assert "tokFILE77aa" in kubeconfig_secrets(str(_kc(tmp_path, f"    tokenFile: {token}\n")))


def test_round15_a_relative_token_file_is_read_where_the_client_reads_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """R15-1: `tokenFile: tok` is beside the kubeconfig for the client, but was looked for in the working
    directory, so a FIFO or /dev/zero there was read by the client unbounded."""
    import os

    from components.errors import InputError
    from components.redaction import secrets_in
    from components.servers.kube import kubeconfig_secrets

    (tmp_path / "kc").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.mkfifo(tmp_path / "kc" / "tok")
    kc = _kc(tmp_path, "    tokenFile: tok\n")
    (tmp_path / "kc" / "config").write_text(kc.read_text())
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="tokenFile 'tok'.*FIFO"):
        kubeconfig_secrets(str(tmp_path / "kc" / "config"))
    assert "Qz7 mP2xy" in secrets_in(["llmpack", "--tracking-uri=http://alice:Qz7 mP2xy@127.0.0.1:9/x"], {})
