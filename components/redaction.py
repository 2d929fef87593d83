"""The one redaction path: every message that can hold a URI, a header or a credential goes through here.

A URI carries its password, a presigned URL its signature, a header its token, and libraries
quote what they were given. :func:`split_uri` is the one URI parser: userinfo is everything before
the URI's last ``@`` (so ``/ # ? @ :`` inside a password never move its end; an ``@`` in a path makes it
blank more, never less). :func:`redact_uri` blanks a URI's userinfo and secret query/fragment values
(known names, or a long random-looking value) and never raises, however malformed; :func:`redact_text`
does that to every URI in free text, blanks bearer tokens, JWTs, known token formats, ``password=``
and ``?token=`` pairs and every secret this process was handed, wherever it reappears;
:func:`components.uri_checks.uri_problem` refuses a bad http(s) host or port up front, quoting only the host;
:func:`install_log_redaction` puts every log record and warning (urllib3's, MLflow's...) through it.
Stdlib only: the CLI's error path imports it. In full: docs/internals/names-and-secrets.md.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote

from components.secret_forms import blank_encoded

MASK = "***"
MIN_SECRET_CHARS = 6  # a shorter value blanked verbatim would blank ordinary words too; the structure covers it
# A query or fragment key whose value is a credential (lower-cased, '-' read as '_').
_SECRET_KEY = re.compile(
    r"(^|_)(token|access_token|id_token|refresh_token|session_token|security_token|jwt|password|passwd|pwd|pw|pass"
    r"|passphrase|secret|client_secret|sig|signature|key|api_key|apikey|access_key|secret_key|private_key|privatekey"
    r"|auth|authorization|credential|credentials|cred|creds|code|session|sessionid|session_id|jsessionid|sid|assertion|client_assertion|otp|cookie)$"
    r"|^x_amz_(signature|credential|security_token)$|^x_goog_(signature|credential)$|^sv$|^se$")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_NO_AUTHORITY = re.compile(r"(?i)(models|runs|file|dbfs|mlflow-artifacts):/|/")  # models:/m@alias, /p: no userinfo
# A URI in free text: its scheme, then everything up to white space (a password may hold quotes and brackets).
_URI_RUN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://\S*")  # a bounded scheme: linear in the text
# ``alice:pw@host[:port]`` typed without a scheme (MLflow quotes it whole in its error): the password blanked
# (the user may be an e-mail address; the password may hold '/' and '@': it runs to the last '@' before a host)
_BARE_USERINFO = re.compile(r"(?<![\w.%+:@-])([A-Za-z0-9._%+!$&'()*,;=-]{0,512}(?:@[A-Za-z0-9.-]{1,253})?):(?!/)"
                            r"([^\s]{1,4096})@(?!sha(?:256|384|512):)(?=[^\s@'\"/]{1,253})")  # @sha256: a digest
# ``?token=x``, ``&jwt=x``, ``;pw=x``, ``#access_token=x`` in a URI or a bare path (urllib3 logs ``/api?token=x``):
# the value runs to white space or the next ``&name=`` / ``;name=`` (a raw '&' or '#' in a secret is blanked too).
_DIGEST = re.compile(r"@sha(?:256|384|512):[0-9a-fA-F]{32,}")  # an image pinned by digest: no userinfo
_QUERY_KEY = r"[A-Za-z0-9_.%+\[\]-]{1,128}"
_QUERY_PAIR = re.compile(rf"(?<=[?&;#])({_QUERY_KEY})=((?:[^\s&;]|[&;](?!{_QUERY_KEY}=))*)")
# The same, a '#' ending a value too (``#a=1#pw=x``): both are looked for and their secret values blanked together,
# so a secret holding a '#' is blanked whole by the first and a pair after a stray '#' by the second.
_HASH_PAIR = re.compile(rf"(?<=[?&;#])({_QUERY_KEY})=((?:[^\s&;#]|[&;#](?!{_QUERY_KEY}=))*)")
_PAIRS = (_QUERY_PAIR, _HASH_PAIR)
_HEADER = re.compile(r"(?i)\b(authorization|proxy-authorization|x-api-key|api-key|cookie|set-cookie|x-[a-z-]*token)"
                     r"(['\"]?\s*[:=]\s*['\"]?)"
                     r"(?:(bearer|basic|token)\s+)?[^\s'\",;}]+")
_SCHEME_TOKEN = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
# Tokens known by their form wherever they stand: a JWT, GitHub/GitLab/Hugging Face/Slack/OpenAI keys, AWS key ids.
_TOKEN_FORM = re.compile(r"\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*"
                         r"|\b(?:gh[pousr]_|github_pat_|glpat-|hf_|xox[abprs]-|sk-(?:proj-|ant-)?)[A-Za-z0-9_-]{20,}"
                         r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
# ``password=x``, ``"token": "x"``: a secret-looking key and its value (a bare ``token: missing`` is prose, not a pair).
_PAIR = re.compile(r"(?i)\b([A-Za-z0-9_.-]*"
                   r"(?:token|password|passwd|pwd|passphrase|jwt|secret|api[_-]?key|access[_-]?key|account[_-]?key"
                   r"|signing[_-]?key|secret[_-]?key|private[_-]?key|client[_-]?secret|auth[_-]?key"
                   r"|signature"
                   r"|credentials?))"
                   r"(\s*=\s*['\"]?|['\"]\s*:\s*['\"])([^\s'\"&;,)}]+)")
# ``password: X`` (YAML, a Secret's stringData) and ``--password X`` (a flag and its value apart): the same names,
# other separators (:func:`_redact_yaml` says when the value is taken for a secret).
_SECRET_NAME = (r"[A-Za-z0-9_.-]*(?:token|password|passwd|pwd|pass|pw|passphrase|secret|api[_-]?key|access[_-]?key"
                r"|secret[_-]?key|signing[_-]?key|private[_-]?key|auth[_-]?key|credentials?)")
_VALUE = r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"]+)"  # a quoted value whole (spaces and all), else up to white space
_YAML_PAIR = re.compile(rf"(?i)\b({_SECRET_NAME})(\s*:\s*)(?!//){_VALUE}")
# a flag naming a Kubernetes Secret (--tracking-secret NAME, --hf-token-secret NAME) takes its name, no secret
_FLAG_PAIR = re.compile(rf"(?i)(?<![\w-])(--(?![\w-]*-secret\b){_SECRET_NAME})([ \t]+){_VALUE}")
# A value that stands for a secret in a command we print for the user to fill in (doctor's fix lines:
# ``--docker-password=TOKEN``, ``"token":"<token>"``, ``$HF_TOKEN``): kept, since it holds none.
# ``$(openssl`` is a command substitution's start (``signing-key="$(openssl rand -hex 32)"``): a program, no secret.
_PLACEHOLDER = re.compile(r"<[A-Za-z_ -]*>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\$\([a-z][a-z0-9_-]*"
                          r"|TOKEN|PASSWORD|SECRET|KEY|YOUR_[A-Z_]+")
# Environment variables whose value is a credential: HF_TOKEN, MLFLOW_TRACKING_PASSWORD, AWS_SECRET_ACCESS_KEY...
_SECRET_ENV = re.compile(r"(?i)(token|password|passwd|secret|secret_key|api_?key|access_?key|account_?key|credentials?"
                         r"|private_?key|signing_?key|connection_string|passphrase|jwt|sshpass|(?:^|_)(?:pass|pwd))$")
_NOT_SECRET_ENV = frozenset({"PWD", "OLDPWD"})  # the shell's working directories, not a password
RANDOM_MIN_CHARS = 20  # a query value this long that looks random is blanked whatever its name
_OWN_SECRETS: dict[str, Any] = {}  # secrets_in() of this process, and the argv and environment it was worked out from


_COMPOUND = re.compile(r"(token|secret|password|passwd|passphrase|pass|pwd|pw|key|sig|signature|auth|cred|creds"
                       r"|credentials?|jwt|otp|cookie|session|sessionid)$|^(secret|passw|apikey|authkey)")


def _secret_key(key: str) -> bool:
    """``key`` names a credential: percent-decoded (``to%6Ben``), camelCase split (``accessToken``), case folded."""
    text = key.strip()
    for _ in range(4):  # encoded, or encoded again (to%25256Ben)
        text = unquote(text)
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text).lower()
    if _SECRET_KEY.search(text.replace("-", "_")):
        return True
    # any word of it a credential's name (access_token_v2, token2, db.pass, api.key, token[0], "api key"), or one
    # written as one word with it (secretkey, dbpass, adminpw, authkey, urlsig): more blanked, never less
    return any(_SECRET_KEY.fullmatch(word) or _COMPOUND.search(word) for word in re.split(r"[^a-z]+", text) if word)


def random_looking(value: str) -> bool:
    """A token by its form (a JWT, ``ghp_``...), or a long value that looks random (upper, lower and digits, many
    distinct characters, no dots); hex digests and run ids (one case) are not."""
    value = unquote(value)
    return _TOKEN_FORM.fullmatch(value) is not None or (
        len(value) >= RANDOM_MIN_CHARS and re.fullmatch(r"[A-Za-z0-9_+/=~-]+", value) is not None
        and sum(c.isdigit() for c in value) >= 2 and sum(c.isupper() for c in value) >= 2
        and sum(c.islower() for c in value) >= 2 and len(set(value)) >= 12)


def _long_path_secret(segment: str) -> bool:
    """A path segment long and mixed enough to be a key (an S3 secret in a presigned path may hold one digit)."""
    value = unquote(segment)
    return (len(value) >= 32 and re.fullmatch(r"[A-Za-z0-9_+/=~-]+", value) is not None
            and any(c.isupper() for c in value) and any(c.islower() for c in value) and len(set(value)) >= 16)


class SplitUri(NamedTuple):
    """A URI as ``prefix`` (``scheme://`` or empty), ``userinfo`` (None: no ``@``), ``host`` (host[:port]), ``tail``."""

    prefix: str
    userinfo: str | None
    host: str
    tail: str


def split_uri(uri: str) -> SplitUri:
    """The one URI parser: userinfo is everything before the last ``@`` after the scheme (a password may hold any
    of ``/ # ? @ :``); the host runs from there to the first ``/ ? #``. ``scheme:///path`` has no authority."""
    scheme = _SCHEME.match(uri)
    start = scheme.end() if scheme else 0
    rest = uri[start:]
    userinfo = None
    if rest.startswith("/") or (not scheme and _NO_AUTHORITY.match(rest)):
        return SplitUri(uri[:start], None, "", rest)
    at = rest.rfind("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1:]
    end = re.search(r"[/?#]", rest)
    cut = end.start() if end else len(rest)
    return SplitUri(uri[:start], userinfo, rest[:cut], rest[cut:])


def _value_end(match: re.Match[str]) -> int:
    """Where a pair's value ends, short of the sentence's punctuation after it (``URI?token=x: problem``): at most
    two such characters, so a secret ending in them shows no more than two."""
    value = match.group(2)
    return match.end(2) - min(2, len(value) - len(value.rstrip(".,:!?)]'\"")))


def _secret_pair(match: re.Match[str]) -> bool:
    value = match.string[match.start(2):_value_end(match)]
    return bool(value) and value != MASK and (_secret_key(match.group(1)) or random_looking(value)
                                              or _encoded_secret(value))


def _encoded_secret(value: str, depth: int = 0) -> bool:
    """Whether a percent-encoded value (``next=https%3A%2F%2F…%3Ftoken%3D…``, up to three times) hides a secret."""
    if "%" not in value or depth >= 3:
        return False
    decoded = unquote(value)
    return decoded != value and (redact_text(decoded, ()) != decoded or _encoded_secret(decoded, depth + 1))


def _redact_pair(match: re.Match[str]) -> str:
    if not _secret_pair(match):
        return match.group(0)
    return f"{match.group(1)}={MASK}{match.string[_value_end(match):match.end()]}"


def _redact_uri(uri: str, every_value: bool = False) -> str:
    """``uri`` with its userinfo and its secret pairs' values blanked, all found in the URI as given (a raw ``@``
    in a query secret, or ``?pw=`` in a password, then blanks the union: more, never less)."""
    parts = split_uri(uri)
    spans = [(m.start(2), _value_end(m)) for pairs in _PAIRS for m in pairs.finditer(uri)
             if every_value or _secret_pair(m)]
    path_at = len(parts.prefix) + (len(parts.userinfo) + 1 if parts.userinfo is not None else 0) + len(parts.host)
    path = re.match(r"[^?#]*", uri[path_at:]).group(0)  # type: ignore[union-attr]
    for seg in re.finditer(r"[^/]+", path):  # a presigned URL's key or signature in its path: every such segment
        if _TOKEN_FORM.fullmatch(unquote(seg.group(0))) or _long_path_secret(seg.group(0)) or _encoded_secret(
                seg.group(0)):  # round 30: a URL percent-encoded in a path segment
            spans.append((path_at + seg.start(), path_at + seg.end()))
    if parts.userinfo is not None:
        spans.append((len(parts.prefix), len(parts.prefix) + len(parts.userinfo)))
    out, pos = [], 0
    for start, end in sorted(spans):
        if end <= pos:
            continue
        if start > pos:
            out += [uri[pos:start], MASK]
        elif not out or out[-1] != MASK:
            out.append(MASK)
        pos = end
    return "".join(out) + uri[pos:]


def redact_uri(uri: str, *, every_value: bool = False) -> str:
    """A URI safe to print: userinfo and secret query/fragment values become ``***`` (``every_value``: every query
    and fragment value, for the user's own tracking URI, whose keys only they know); never raises."""
    try:
        return _redact_uri(str(uri), every_value)
    except Exception:  # noqa: BLE001 - a redactor that raised would put the secret in its traceback
        return "<a URI that could not be redacted>"


_REMEMBERED: set[str] = set()  # secrets read from a file the user named (a kubeconfig's): see remember_secrets


def remember_secrets(values: Iterable[str]) -> None:
    """Secrets this process read from a file the user named (a kubeconfig's tokens, passwords, its server's
    userinfo, its exec plugin's env and args): blanked wherever they reappear, as argv's and the environment's
    are (a failing exec plugin echoes them; a library's error quotes the server)."""
    _REMEMBERED.update(v for v in values if v and len(v) >= MIN_SECRET_CHARS)


def text_secrets(text: str) -> set[str]:
    """The secrets a URI-shaped ``text`` holds, with or without a scheme: its password (and userinfo), and its
    query and fragment values that could be secrets."""
    found = _uri_secrets(text, every_value=True) if "://" in text else set()
    parts = split_uri(text)
    if parts.userinfo:
        found |= {parts.userinfo, parts.userinfo.partition(":")[2]}
    for match in _BARE_USERINFO.finditer(text):
        found |= {f"{match.group(1)}:{match.group(2)}", match.group(2)}
    return {f for f in found if f}


def _a_directory(name: str, value: str) -> bool:
    """A ``*_PWD`` variable that holds an absolute path to a directory (``HOST_PWD=$PWD`` of a dev container): a
    working directory, not a password."""
    return name.upper().endswith("PWD") and value.startswith("/") and os.path.isdir(value)


def secrets_in(argv: Iterable[str] | None = None, env: Mapping[str, str] | None = None) -> set[str]:
    """The secrets this process was handed, to blank verbatim wherever they reappear (see the module docstring)."""
    if argv is None and env is None:  # this process's own: worked out again only when they change (a log record each)
        key = (tuple(sys.argv), tuple(os.environ.items()))
        if _OWN_SECRETS.get("key") != key:
            _OWN_SECRETS.update(key=key, found=secrets_in(list(key[0]), dict(key[1])))
        return set(_OWN_SECRETS["found"]) | _REMEMBERED
    argv = sys.argv if argv is None else argv
    env = os.environ if env is None else env
    found: set[str] = set()
    for name, value in env.items():
        if value and _SECRET_ENV.search(name) and name.upper() not in _NOT_SECRET_ENV \
                and not name.startswith("LLMPACK_TEST_") and not _a_directory(name, value):
            found.add(value)
    for text in [*argv, *env.values()]:
        for match in _URI_RUN.finditer(str(text)):
            found |= _uri_secrets(match.group(0), every_value=True)
        for match in _BARE_USERINFO.finditer(str(text)):
            found |= {f"{match.group(1)}:{match.group(2)}", match.group(2)}
        whole = str(text).strip()
        if whole.startswith("-") and "=" in whole:  # --flag=VALUE: its value
            whole = whole.split("=", 1)[1]
        if "@" in whole and ":" in whole and not _DIGEST.search(whole):  # one URI: a password may hold spaces
            userinfo = split_uri(whole).userinfo
            if userinfo and ":" in userinfo:
                found |= {userinfo, userinfo.split(":", 1)[1]}
    return {s for s in found if len(s) >= MIN_SECRET_CHARS}


def _uri_secrets(uri: str, *, every_value: bool = False) -> set[str]:
    """A URI's secrets: its password, its secret pairs' values; ``every_value``: also any query or fragment value
    that could be one (8+ characters with a digit, or 12+): a URI the user handed over, whose keys only they know."""
    out: set[str] = set()
    parts = split_uri(uri)
    if parts.userinfo:
        password = parts.userinfo.partition(":")[2]
        out |= {parts.userinfo, password, unquote(password)}
    for match in (m for pairs in _PAIRS for m in pairs.finditer(uri)):
        if _secret_pair(match) or (every_value and _could_be_secret(uri[match.start(2):_value_end(match)])):
            trimmed = uri[match.start(2):_value_end(match)]
            out |= {match.group(2), unquote(match.group(2)), trimmed, unquote(trimmed)}
    return {s for s in out if s}


def strong_secrets() -> set[str]:
    """The known secrets (:func:`secrets_in`) that could not be an ordinary word of a store's text: 8+ characters
    with a digit, or 12+. A report blanks these in what it reads from a store; a weak password such as ``mlflow``
    would blank the orchestrator's own name there (its URI forms are still redacted by their structure)."""
    return {s for s in secrets_in() if _could_be_secret(s)}


def _could_be_secret(value: str) -> bool:
    return (len(value) >= 8 and any(c.isdigit() for c in value)) or len(value) >= 12


MLFLOW_NO_URL = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"  # MLflow's switch for its "View run at: <URI>" line
def blank_known(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with every known secret (``secrets``, default :func:`secrets_in`) blanked, as typed, percent-encoded
    or inside base64; nothing else changed (a tag value, a store's text)."""
    for secret in sorted(secrets_in() if secrets is None else secrets, key=len, reverse=True):
        if not secret:
            continue
        text = text.replace(secret, MASK)
        if len(secret) >= MIN_SECRET_CHARS:
            text = blank_encoded(text, secret, MASK)
    return text


def redact_text(text: object, secrets: Iterable[str] | None = None) -> str:
    """Free text (a message, a traceback) with every URI redacted, header, token and ``password=`` values and every
    known secret (``secrets``, default :func:`secrets_in`: as typed, percent-encoded or in base64) blanked; never
    raises."""
    try:
        out = blank_known(str(text), secrets)
        out = _URI_RUN.sub(_redact_run, out)
        out = _BARE_USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", out)
        for pairs in _PAIRS:  # the URIs' queries, and bare paths' (``/api?token=x``)
            out = pairs.sub(_redact_pair, out)
        out = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{(m.group(3) + ' ') if m.group(3) else ''}{MASK}", out)
        out = _SCHEME_TOKEN.sub(lambda m: f"{m.group(1)} {MASK}", out)
        out = _TOKEN_FORM.sub(MASK, out)
        out = _YAML_PAIR.sub(_redact_yaml, out)
        out = _FLAG_PAIR.sub(_redact_yaml, out)
        return _PAIR.sub(_redact_kv, out)
    except Exception:  # noqa: BLE001 - a redactor that raised would put the secret in its traceback
        return "<a message that could not be redacted>"


def redact_data(value: Any) -> Any:
    """``value`` (a summary a command prints as JSON) with :func:`redact_text` on every string, key or value, before
    it is encoded: a URI's userinfo and query credentials and every known secret (round 24: ``cluster submit
    --json`` printed the tracking URI and the server's address whole). Known secrets: the strong ones only
    (:func:`strong_secrets`), so that a weak password such as ``mlflow`` leaves the path names exact."""
    return _redacted(value, strong_secrets())


def _redacted(value: Any, secrets: set[str]) -> Any:
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {redact_text(k, secrets) if isinstance(k, str) else k: _redacted(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v, secrets) for v in value]
    return value


def _redact_yaml(match: re.Match[str]) -> str:
    """``password: X`` or ``--password X``: X blanked when it could be a secret: quoted, or 6+ characters with a
    digit, or 12+ characters, or random-looking (``token: not set`` stays readable)."""
    value = match.group(3)
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
    core = value[1:-1] if quoted else value
    if _PLACEHOLDER.fullmatch(core) or core == MASK:
        return match.group(0)
    if quoted or (len(core) >= 6 and any(c.isdigit() for c in core)) or len(core) >= 12 or random_looking(core):
        return f"{match.group(1)}{match.group(2)}{value[0] + MASK + value[-1] if quoted else MASK}"
    return match.group(0)


def _redact_kv(match: re.Match[str]) -> str:
    """``password=x``: the value blanked (a placeholder or a blank already kept; the sentence's ':' or '.' kept)."""
    value = match.group(3)
    core = value[:len(value) - min(2, len(value) - len(value.rstrip(".,:!?]")))]
    if core == MASK or _PLACEHOLDER.fullmatch(value) or _PLACEHOLDER.fullmatch(core):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}{MASK}{value[len(core):]}"


def _redact_run(match: re.Match[str]) -> str:
    """A URI found in text, up to white space (its userinfo ends at the run's last '@'), redacted."""
    return _redact_uri(match.group(0))


def printable(text: str, limit: int = 200) -> str:
    """``text`` (a stranger's) safe on a terminal line: redacted, control and escape bytes as '?', cut to ``limit``."""
    out = "".join(c if c.isprintable() else "?" for c in redact_text(text))
    return out if len(out) <= limit else out[: limit - 3] + "..."


# ----------------------------------------------------------------- log records and warnings: the same path

def _loggers_with_handlers() -> list[logging.Logger]:
    """The root logger and every logger that has handlers of its own now (urllib3's, a tracking client's...):
    found, not named, so a library added later is covered the same way."""
    found = [logging.getLogger()]
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger.handlers:
            found.append(logger)
    return found


def _redact_record(record: logging.LogRecord) -> None:
    if getattr(record, "_llmpack_redacted", False):
        return
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose args do not fit its format: both, redacted
        message = f"{record.msg} {record.args!r}"
    record.msg, record.args = redact_text(message), None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        import traceback

        record.exc_text = redact_text("".join(traceback.format_exception(*record.exc_info))).rstrip("\n")
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info)
    record._llmpack_redacted = True


class RedactingFilter(logging.Filter):
    """A logger's or handler's filter: each record's message, traceback and stack go through :func:`redact_text`."""

    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record)
        return True


def install_log_redaction() -> None:
    """Every log record (any logger's: a filter on ``urllib3`` would not see ``urllib3.connectionpool``'s, so
    records are redacted as they are made, and :class:`RedactingFilter` sits on the root, every logger that has
    handlers of its own, and their handlers too) and every warning shown or logged goes through
    :func:`redact_text`. And MLflow is told not to print a run's address when the run ends: it writes the tracking
    URI whole, password included, straight to stdout (no log record), which a step's log and its uploaded artifacts
    kept (round 20); set in the environment, so every process this one starts inherits it. Idempotent."""
    os.environ[MLFLOW_NO_URL] = "true"
    made = logging.getLogRecordFactory()
    if not getattr(made, "_llmpack_redacts", False):
        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = made(*args, **kwargs)
            _redact_record(record)
            return record

        factory._llmpack_redacts = True  # type: ignore[attr-defined]
        factory._llmpack_original = made  # type: ignore[attr-defined]  # what a test puts back
        logging.setLogRecordFactory(factory)
    for logger in _loggers_with_handlers():
        for holder in [logger, *logger.handlers]:
            if not any(isinstance(f, RedactingFilter) for f in holder.filters):
                holder.addFilter(RedactingFilter())
    shown = warnings.formatwarning
    if not getattr(shown, "_llmpack_redacts", False):
        def formatwarning(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
            return redact_text(shown(message, category, filename, lineno, line))

        formatwarning._llmpack_redacts = True  # type: ignore[attr-defined]
        formatwarning._llmpack_original = shown  # type: ignore[attr-defined]
        warnings.formatwarning = formatwarning
