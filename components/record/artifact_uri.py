"""Where a run's artifacts may go (:func:`artifact_uri_problem`): the artifact URI is the experiment's, data a
writer of the store chose, never where credentials or a model go on its word; :func:`check_artifact_uri` refuses
in one line before anything is uploaded."""

from __future__ import annotations

import re

from components import settings
from components.errors import InputError
from components.redaction import redact_uri

# Schemes whose artifact client sends the tracking store's credentials (MLflow's HttpArtifactRepository and
# mlflow-artifacts send get_default_host_creds(): MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN) to the URI's host.
_CREDENTIAL_SCHEMES = ("http", "https", "mlflow-artifacts")


_AUTHORITY = re.compile(r"(?:[A-Za-z0-9._~%!$&'()*+,;=:-]*@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::([0-9]{1,5}))?")
# Object stores and file systems whose clients use their own credentials, never the tracking server's.
_OWN_CREDENTIAL_SCHEMES = ("s3", "gs", "wasbs", "abfss", "dbfs", "file", "")


def artifact_uri_problem(artifact_uri: str, store_uri: str) -> str | None:
    """Why the run's artifact URI must not be written to, or None.

    The artifact URI comes from the experiment, which anyone who can write the store may have created
    (or renamed and recreated) before the user's first run: it is data, never where credentials or a
    model go on its word. Taken: ``mlflow-artifacts:/`` (the server proxies), an http(s) or
    ``mlflow-artifacts`` location on the tracking server's own host and port (never plain http under an https
    store: the credentials would go in clear text), a path for a local store
    (sqlite, a directory), and the object stores (``s3://``, ``gs://``, ``wasbs://``, ``abfss://``,
    ``dbfs:``: their own credentials, the store admin's choice). Refused: any other host (those clients
    send the tracking credentials to it), a path named by a remote server (written on this machine:
    a stranger's directory, or a link planted in it, would take the model), any other scheme with a
    host (``ftp://``, ``sftp://``, ``hdfs://``...), and an authority not
    plain ``[user@]host[:port]`` (a backslash, a space, a ``+`` port: parsers read those differently,
    and the one that uploads is not the one that checked).
    """
    from urllib.parse import urlsplit

    text = str(artifact_uri)
    if not text.isprintable():
        return "an artifact location with a control character"
    try:
        a, s = urlsplit(text), urlsplit(str(store_uri))
        scheme, store_scheme = a.scheme.lower(), s.scheme.lower()
        if a.netloc and _AUTHORITY.fullmatch(a.netloc) is None:
            return "an artifact location whose host is not plain host[:port]"
        if scheme in _CREDENTIAL_SCHEMES:
            if scheme == "mlflow-artifacts" and not a.netloc:
                return None
            if store_scheme in ("http", "https") and (a.hostname, a.port or _default_port(scheme)) == (
                    s.hostname, s.port or _default_port(store_scheme)):
                if store_scheme == "https" and scheme == "http":  # the credentials would go in clear text (round 24)
                    return "an artifact location over plain http on an https tracking server"
                return None
            return "an artifact location on another host than the tracking server's"
    except ValueError:  # a port that is not a number, an unclosed IPv6 bracket
        return "an artifact location that does not parse as a URI"
    if scheme in ("", "file") and store_scheme in ("http", "https"):
        # a path named by a remote store is written on this machine: a stranger's directory (or a link they plant
        # in it) would take the model, or overwrite a file of the user's through the link
        return "a local path named by a remote tracking server (written on this machine, not the server)"
    if scheme in _OWN_CREDENTIAL_SCHEMES:
        return None
    return f"an artifact location of scheme {scheme!r}, not the tracking server's or an object store"


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def check_artifact_uri(artifact_uri: str, store_uri: str) -> None:
    """One :class:`InputError` line when :func:`artifact_uri_problem` finds one; nothing is uploaded then."""
    problem = artifact_uri_problem(artifact_uri, store_uri)
    if problem is not None:
        where, store = redact_uri(artifact_uri, every_value=True), redact_uri(store_uri, every_value=True)
        raise InputError(f"the run's artifacts would go to {where}: {problem} ({store}); its experiment was made "
                         f"with that location, perhaps by someone else: nothing was uploaded (name an experiment of "
                         f"your own with {settings.EXPERIMENT.name})")
