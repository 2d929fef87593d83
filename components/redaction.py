"""The one redaction path: every message that can hold a URI, a header or a credential goes through here.

A URI carries its password, a presigned URL its signature, a header its token, and libraries
quote what they were given. :func:`redact_uri` blanks a URI's userinfo and secret-looking query
values and never raises, however malformed; :func:`redact_text` does that to every URI in free text,
blanks bearer tokens and ``password=`` pairs and every secret this process was handed, wherever it
reappears; :func:`uri_problem` refuses a bad http(s) host or port up front, quoting only the host.
Stdlib only: the CLI's error path imports it. In full: docs/internals/names-and-secrets.md.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Iterable, Mapping

MASK = "***"
MIN_SECRET_CHARS = 6  # a shorter value blanked verbatim would blank ordinary words too; the structure covers it
# A query or fragment key whose value is a credential (lower-cased, '-' read as '_').
_SECRET_KEY = re.compile(
    r"(^|_)(token|access_token|id_token|refresh_token|password|passwd|pwd|pass|secret|client_secret|sig|signature"
    r"|key|api_key|apikey|access_key|secret_key|auth|authorization|credential|credentials|code|session)$"
    r"|^x_amz_(signature|credential|security_token)$|^x_goog_(signature|credential)$|^sv$|^se$")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_HEADER = re.compile(r"(?i)\b(authorization|proxy-authorization|x-api-key|api-key|cookie|set-cookie)"
                     r"(['\"]?\s*[:=]\s*['\"]?)"
                     r"(?:(bearer|basic|token)\s+)?[^\s'\",;}]+")
_SCHEME_TOKEN = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
# ``password=x``, ``"token": "x"``: a secret-looking key and its value (a bare ``token: missing`` is prose, not a pair).
_PAIR = re.compile(r"(?i)\b([A-Za-z0-9_.-]*"
                   r"(?:token|password|passwd|secret|api_?key|access_?key|account_?key|signature))"
                   r"(\s*=\s*['\"]?|['\"]\s*:\s*['\"])(?!\*\*\*)([^\s'\"&;,)}]+)")
# A value that stands for a secret in a command we print for the user to fill in (doctor's fix lines:
# ``--docker-password=TOKEN``, ``"token":"<token>"``, ``$HF_TOKEN``): kept, since it holds none.
_PLACEHOLDER = re.compile(r"<[A-Za-z_ -]*>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|TOKEN|PASSWORD|SECRET|KEY|YOUR_[A-Z_]+")
# Environment variables whose value is a credential: HF_TOKEN, MLFLOW_TRACKING_PASSWORD, AWS_SECRET_ACCESS_KEY...
_SECRET_ENV = re.compile(r"(?i)(token|password|passwd|secret|secret_key|api_?key|access_?key|account_?key|credentials?"
                         r"|private_?key|connection_string)$")


def _secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key.strip().lower().replace("-", "_")))


def _redact_pairs(part: str) -> str:
    """``a=1&token=x;sig=y`` with each secret-looking value blanked."""
    out = []
    for piece in re.split(r"([&;])", part):
        key, sep, value = piece.partition("=")
        out.append(f"{key}={MASK}" if sep and value and _secret_key(key) else piece)
    return "".join(out)


def _redact_uri(uri: str) -> str:
    scheme = _SCHEME.match(uri)
    start = scheme.end() if scheme else 0
    rest = uri[start:]
    authority_end = rest.find("/")
    authority = rest if authority_end < 0 else rest[:authority_end]
    # userinfo (a bare host:port may carry it too): everything up to the last '@' before the path,
    # '#' and '?' included
    if "@" in authority:
        at = authority.rfind("@")
        rest = MASK + rest[at:]
        authority = MASK + authority[at:]
    head, sep, fragment = rest.partition("#")
    path, qsep, query = head.partition("?")
    if qsep:
        path += qsep + _redact_pairs(query)
    if sep:
        path += sep + _redact_pairs(fragment)
    return uri[:start] + path


def redact_uri(uri: str) -> str:
    """A URI safe to print: userinfo and secret query/fragment values become ``***``; never raises."""
    try:
        return _redact_uri(str(uri))
    except Exception:  # noqa: BLE001 - a redactor that raised would put the secret in its traceback
        return "<a URI that could not be redacted>"


def secrets_in(argv: Iterable[str] | None = None, env: Mapping[str, str] | None = None) -> set[str]:
    """The secrets this process was handed, to blank verbatim wherever they reappear (see the module docstring)."""
    argv = sys.argv if argv is None else argv
    env = os.environ if env is None else env
    found: set[str] = set()
    for name, value in env.items():
        if value and _SECRET_ENV.search(name) and not name.startswith("LLMPACK_TEST_"):
            found.add(value)
    for text in [*argv, *env.values()]:
        for match in _URI_IN_TEXT.finditer(str(text)):
            found |= _uri_secrets(match.group(0))
    return {s for s in found if len(s) >= MIN_SECRET_CHARS}


def _uri_secrets(uri: str) -> set[str]:
    from urllib.parse import unquote

    out: set[str] = set()
    rest = uri[_SCHEME.match(uri).end():] if _SCHEME.match(uri) else uri
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        userinfo = authority[: authority.rfind("@")]
        password = userinfo.partition(":")[2]
        out |= {userinfo, password, unquote(password)}
    for part in re.split(r"[?#&;]", rest)[1:]:
        key, sep, value = part.partition("=")
        if sep and _secret_key(key):
            out |= {value, unquote(value)}
    return {s for s in out if s}


def redact_text(text: object, secrets: Iterable[str] | None = None) -> str:
    """Free text (a message, a traceback) with every URI redacted, header and ``password=`` values and every
    known secret (``secrets``, default :func:`secrets_in`) blanked; never raises."""
    try:
        out = str(text)
        for secret in sorted(secrets_in() if secrets is None else secrets, key=len, reverse=True):
            if secret:
                out = out.replace(secret, MASK)
        out = _URI_IN_TEXT.sub(_redact_match, out)
        out = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{(m.group(3) + ' ') if m.group(3) else ''}{MASK}", out)
        out = _SCHEME_TOKEN.sub(lambda m: f"{m.group(1)} {MASK}", out)
        return _PAIR.sub(lambda m: m.group(0) if _PLACEHOLDER.fullmatch(m.group(3))
                         else f"{m.group(1)}{m.group(2)}{MASK}", out)
    except Exception:  # noqa: BLE001 - a redactor that raised would put the secret in its traceback
        return "<a message that could not be redacted>"


def _redact_match(match: re.Match[str]) -> str:
    """A URI found in text, redacted; the sentence's punctuation after it (``URI: problem``) kept as it was."""
    uri = match.group(0)
    core = uri.rstrip(".,:;!?)")
    return redact_uri(core) + uri[len(core):]


def uri_problem(uri: str) -> str | None:
    """What is wrong with an http(s) URI's host or port (quoting only the host part), else None.

    Other schemes (sqlite, file, databricks...) are left to their library: they hold no port.
    """
    scheme = _SCHEME.match(uri)
    if not scheme or scheme.group(0).lower() not in ("http://", "https://"):
        return None
    authority = re.split(r"[/?#]", uri[scheme.end():], maxsplit=1)[0]
    host = authority[authority.rfind("@") + 1:]
    if host.startswith("["):
        close = host.find("]")
        if close < 0:
            return f"host {host[:60]!r}: an IPv6 address needs its closing ']'"
        literal, port = host[1:close], host[close + 1:]
        try:
            ipaddress.IPv6Address(literal.split("%", 1)[0])
        except ValueError:
            return f"host [{literal[:60]}]: not an IPv6 address"
        if port and not port.startswith(":"):
            return f"host {host[:60]!r}: expected ':PORT' after the IPv6 address"
        port = port[1:] if port else ""
    else:
        if host.count(":") > 1:
            return f"host {host[:60]!r}: more than one ':' (an IPv6 address goes in [brackets])"
        name, _, port = host.partition(":")
        if not name:
            return "no host"
        if not re.fullmatch(r"[A-Za-z0-9._~%!$&'()*+,;=-]+", name):
            return f"host {name[:60]!r} is not a host name"
    if port and (not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536):
        return f"port {port[:20]!r} is not a number from 1 to 65535"
    return None
