"""What is wrong with a URI before any request is made with it (:func:`uri_problem`), and what names a store
(:func:`store_key`): parsed with the redactor's one URI parser (:func:`components.redaction.split_uri`), so a
problem is worded without the URI's credentials."""

from __future__ import annotations

import ipaddress
import re

from components.redaction import split_uri


def uri_problem(uri: str) -> str | None:
    """What is wrong with an http(s) URI's host or port (quoting only the host part), else None.

    Other schemes (sqlite, file, databricks...) are left to their library: they hold no port.
    """
    parts = split_uri(uri)
    if ("://" not in uri and "@" in uri and not uri.startswith(("/", ".", "~"))
            and not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", uri)):  # user@host typed with no scheme: never a path
        return ("no scheme before its user name and password (not shown): write http://HOST:PORT or https://..., "
                "the user and password in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
    if parts.prefix.lower() not in ("http://", "https://"):
        return None
    if parts.userinfo is not None and re.search(r"[/?#\s]", parts.userinfo):
        return ("its user name or password (not shown) holds a '/', '?', '#' or a space: percent-encode them "
                "(%2F, %3F, %23, %20); an '@' in the path or query: %40")
    host = parts.host
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


def store_key(uri: str) -> tuple[str, ...]:
    """What names a store, never its credentials: ``(scheme, host, port)`` of a URI with a host (the default port
    filled in, the host lower-cased), else ``(scheme, the rest)`` (``sqlite:///p``: its path; ``databricks``)."""
    parts = split_uri(uri.strip())
    scheme = parts.prefix[:-3].lower() if parts.prefix else uri.partition(":")[0].lower() if ":" in uri else ""
    if not parts.host:
        return (scheme, parts.tail if parts.prefix else uri.strip())
    host, port = parts.host.lower(), ""
    if host.startswith("["):
        host, _, port = host.partition("]")
        port = port.lstrip(":")
    elif ":" in host:
        host, _, port = host.rpartition(":")
    port = port or {"http": "80", "https": "443"}.get(scheme, "")
    return (scheme, host.rstrip("."), port)
