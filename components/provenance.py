"""Provenance: a keyed signature (HMAC-SHA256) over what llmpack wrote, so state found on disk or in a
store is trusted only when the user's own key signed it (a checksum list proves nothing: whoever can
write the files rewrites the list too). The key, in the order looked up:

1. ``LLMPACK_SIGNING_KEY``: the key itself, hex (at least 32 bytes). On a cluster every compiled pod
   reads it from key ``signing-key`` of the tracking Secret ``llmpack-mlflow``.
2. ``LLMPACK_SIGNING_KEY_FILE`` or, unset, ``~/.config/llmpack/signing.key`` (``$XDG_CONFIG_HOME``
   honoured): generated on first use, 32 random bytes hex, mode 0600. A key file that is a symlink,
   not a regular file, or readable by anyone but its owner is refused (one :class:`InputError`).

Each signature is bound to a *kind* (``checkpoint``, ``evaluation``, ``model-version``...), so one
made for one kind never verifies as another. Payloads are canonical JSON (sorted keys, no NaN).
In full: docs/internals/step-process.md ("Provenance").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.settings import SIGNING_KEY, SIGNING_KEY_FILE

PREFIX = "hmac-sha256:"
_KEY_BYTES = 32
_KEY_FILE_MAX = 1024


def default_key_file() -> Path:
    """Where the key file lives when ``LLMPACK_SIGNING_KEY_FILE`` is unset."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmpack" / "signing.key"


def parse_key(text: str, where: str) -> bytes:
    """The key ``text`` holds (hex, at least 32 bytes); else one :class:`InputError` naming ``where``."""
    fix = ("64 hex characters or more: `openssl rand -hex 32`" + (", or remove the file to have a new one made"
                                                                   if where.startswith("signing key file") else ""))
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise InputError(f"{where}: the signing key is not hex ({fix})") from None
    if len(key) < _KEY_BYTES:
        raise InputError(f"{where}: the signing key is {len(key)} bytes; at least {_KEY_BYTES} are needed ({fix})")
    return key


def _read_key_file(path: Path) -> bytes:
    where = f"signing key file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{where}: cannot be opened ({exc.strerror}; a symlink is refused)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{where}: not a regular file")
        if st.st_mode & 0o077:
            raise InputError(f"{where}: readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                             f"run `chmod 600 {path}`")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise InputError(f"{where}: owned by another user")
        data = os.read(fd, _KEY_FILE_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > _KEY_FILE_MAX:
        raise InputError(f"{where}: larger than {_KEY_FILE_MAX} bytes")
    return parse_key(data.decode("ascii", "replace"), where)


def _create_key_file(path: Path) -> None:
    """Write a new random key at ``path`` (0600) unless one appears first (two processes racing both read it)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (secrets.token_hex(_KEY_BYTES) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic, and fails when the file exists: the first writer wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def signing_key() -> bytes:
    """The user's signing key (see the module docstring); creates the key file on first use."""
    text = SIGNING_KEY.get()
    if text:
        return parse_key(text, SIGNING_KEY.name)
    path = Path(SIGNING_KEY_FILE.get() or default_key_file()).expanduser()
    if not os.path.lexists(path):
        try:
            _create_key_file(path)
        except OSError as exc:  # a read-only home (a cluster pod's root filesystem)
            raise InputError(f"no signing key: {SIGNING_KEY.name} is unset and {path} cannot be made "
                             f"({exc.strerror}); on a cluster add key 'signing-key' to the Secret llmpack-mlflow "
                             "(kubectl create secret generic llmpack-mlflow ... "
                             "--from-literal=signing-key=$(openssl rand -hex 32))") from None
    return _read_key_file(path)


def canonical(payload: Mapping[str, Any]) -> bytes:
    """The bytes a mapping is signed as: sorted keys, compact, finite numbers only."""
    try:
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        raise InputError("a signed payload holds NaN or infinity") from None


def sign(kind: str, payload: Mapping[str, Any], key: bytes | None = None) -> str:
    """``hmac-sha256:<hex>`` over ``kind`` and the canonical payload."""
    mac = hmac.new(key if key is not None else signing_key(), kind.encode() + b"\0" + canonical(payload),
                   hashlib.sha256)
    return PREFIX + mac.hexdigest()


def verify(kind: str, payload: Mapping[str, Any], signature: object, key: bytes | None = None) -> bool:
    """True only when ``signature`` is the user's key's signature of ``payload`` as ``kind``."""
    if not isinstance(signature, str) or not signature.startswith(PREFIX) or len(signature) > 200:
        return False
    key = key if key is not None else signing_key()  # a broken key file is its own error, never "unsigned"
    try:
        expected = sign(kind, payload, key)
    except InputError:  # a payload with NaN was never signed by us
        return False
    return hmac.compare_digest(expected, signature)
