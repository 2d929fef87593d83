"""How a known secret also appears once encoded, and each form blanked: percent-encoded (every way
:mod:`urllib.parse` writes it) and inside base64 (a Basic credential ``user:secret``, at each byte alignment,
standard and URL-safe). Used by :func:`components.redaction.blank_known`; stdlib only."""

from __future__ import annotations

import functools
import re

_B64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-=")


@functools.lru_cache(maxsize=1024)
def _encoded(secret: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """How a known ``secret`` also appears: percent-encoded (every way :mod:`urllib.parse` writes it), and the
    base64 characters that depend on its bytes only, at each of the three byte alignments (a Basic credential
    ``user:secret``), standard and URL-safe: ``(percent forms, base64 cores)``."""
    import base64
    from urllib.parse import quote, quote_plus

    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quote(secret, safe=""))  # %2f, not the letters
    forms = {quote(secret, safe=""), quote(secret), quote_plus(secret), lower_hex} - {secret}
    cores: set[str] = set()
    raw = secret.encode()
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw).decode()
        core = encoded[(4 if pad else 0):((pad + len(raw)) // 3) * 4]
        if len(core) >= 8:
            cores |= {core, core.replace("+", "-").replace("/", "_")}
    return tuple(sorted(forms, key=len, reverse=True)), tuple(sorted(cores))


def _blank_runs(text: str, core: str, mask: str) -> str:
    """Every run of base64 characters in ``text`` that holds ``core``, blanked whole (linear: no regex)."""
    start = text.find(core)
    while start >= 0:
        left, right = start, start + len(core)
        while left > 0 and text[left - 1] in _B64:
            left -= 1
        while right < len(text) and text[right] in _B64:
            right += 1
        text = f"{text[:left]}{mask}{text[right:]}"
        start = text.find(core, left + len(mask))
    return text


def blank_encoded(text: str, secret: str, mask: str) -> str:
    """``text`` with ``secret``'s percent-encoded forms and every base64 run holding it replaced by ``mask``."""
    forms, cores = _encoded(secret)
    for form in forms:
        text = text.replace(form, mask)
    for core in cores:
        if core in text:
            text = _blank_runs(text, core, mask)
    return text
