"""llmpack's loader of a registered model: the files are checked against the version's signature first.

``mlflow.pyfunc.load_model("models:/NAME@champion")`` runs whatever ``pyfunc_model.py`` the store
holds now; anyone who can write the artifact store can replace it (or the weights) and the alias
still points at it. :func:`load_model` instead resolves the version, verifies its provenance
signature (:mod:`components.serving.signed`: the user's key, over its name, version, run, source
and the sha256 of every model file), downloads the files, checks every one byte for byte (none
missing, none added, nothing but regular files), and only then hands that local, checked copy to
MLflow, which imports the model's code from it. A failed check is one :class:`UntrustedModel`
line naming the file; nothing from the store has been imported.

``python -m components.serving.verify models:/NAME@ALIAS DIR`` does the same and leaves the
checked copy in ``DIR`` (``mlflow models serve -m DIR`` serves it). docs/serving.md says what this
does not cover.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.serving import registry_store
from components.serving.promotion import CHAMPION
from components.serving.signed import UntrustedModel, check_files, shown_name, verified_champion, verified_version

_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[0-9]+))/?$")

__all__ = ["UntrustedModel", "fetch_verified", "load_model", "main"]


def _resolve(model_uri: str, tracking_uri: str | None) -> Any:
    """The registry's model version a ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` URI names."""
    from mlflow.tracking import MlflowClient

    match = _MODELS_URI.match(model_uri)
    if match is None:
        raise InputError(f"{model_uri}: not a registered model URI (models:/NAME@ALIAS or models:/NAME/VERSION): "
                         "only a registry version carries the signature to check")
    client = registry_store.client(tracking_uri) if tracking_uri else MlflowClient()
    try:
        if match["alias"]:
            mv = client.get_model_version_by_alias(match["name"], match["alias"])
            tags = dict(client.get_registered_model(match["name"]).tags or {})
        else:
            return client.get_model_version(match["name"], match["version"])
    except Exception as exc:  # noqa: BLE001 - MLflow's error for a missing model, alias or version: one line
        raise registry_store.lookup_error(model_uri, exc) from None
    if match["alias"] == CHAMPION:  # an alias is anyone's to move: @champion only as the user's key promoted it
        promoted = verified_champion(model_uri, name=match["name"], version=str(mv.version),
                                     run_id=str(mv.run_id or ""), model_tags=tags)
        when = promoted.get("promoted_at")
        if isinstance(when, (int, float)):  # a rollback to an earlier record shows as an older promotion
            import datetime

            stamp = datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
            print(f"{model_uri}: version {mv.version}, made champion {stamp} with your key", file=sys.stderr)
    return mv


def fetch_verified(model_uri: str, dst: str | Path, *, tracking_uri: str | None = None) -> Path:
    """The registered model's files in ``dst`` (new or empty), each checked against its signed sha256.

    One :class:`UntrustedModel` (an :class:`InputError`) when the version is unsigned, signed with
    another key, names another run or source, or any file differs; ``dst`` is then emptied.
    """
    import mlflow.artifacts

    mv = _resolve(model_uri, tracking_uri)
    payload = verified_version(model_uri, name=str(mv.name), version=str(mv.version), run_id=str(mv.run_id or ""),
                               source=str(mv.source or ""), tags=dict(mv.tags or {}))
    out = Path(dst)
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise InputError(f"{out}: exists and is not an empty directory; the checked copy needs one of its own")
    created = not out.exists()
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        _check_private(out)
    except InputError:  # someone else's directory: left as it was
        if created:
            out.rmdir()
        raise
    try:
        # the store's listing first: a file added or of another size is refused before a byte is downloaded
        listed = _listing(model_uri, payload["source"], tracking_uri)
        check_listing(model_uri, listed, payload["files"])
        # then the signed files only, one by one, as bytes (nothing is imported); then every byte checked
        local = out / Path(str(payload["source"]).rstrip("/")).name
        try:
            for rel in sorted(payload["files"]):
                (local / rel).parent.mkdir(parents=True, exist_ok=True)
                mlflow.artifacts.download_artifacts(artifact_uri=f"{payload['source'].rstrip('/')}/{rel}",
                                                    dst_path=str((local / rel).parent), tracking_uri=tracking_uri)
        except Exception as exc:  # noqa: BLE001 - a planted symlink or FIFO in the store: MLflow refuses, one line
            raise UntrustedModel(f"{model_uri}: its files could not be copied as regular files "
                                 f"({type(exc).__name__}); not loaded") from None
        check_files(model_uri, local, payload["files"])
    except BaseException:  # nothing half-written: the directory as it was
        shutil.rmtree(out, ignore_errors=True)
        if not created:
            out.mkdir()
        raise
    return local


def _check_private(out: Path) -> None:
    """The checked copy only where no one else can swap it before it is served: ``out`` ours and writable by us
    alone, and every directory above it ours or root's and, when others may write in it, sticky (as /tmp is)."""
    import stat

    me = os.geteuid()
    st = os.lstat(out)
    if st.st_uid != me or st.st_mode & 0o022:
        raise InputError(f"{out}: owned by someone else or writable by others; the checked copy needs a directory "
                         "of your own (nothing was copied)")
    lexical = Path(os.path.abspath(out))
    # every directory up to /, as typed (a link's own directory too: whoever may write there repoints the link
    # after the check) and as resolved: any of them renamed swaps the copy's path
    for above in dict.fromkeys([*lexical.parents, *out.resolve().parents]):
        st = os.stat(above)
        if st.st_uid not in (me, 0) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            raise InputError(f"{above}: another user may rename what is in it (owned by someone else, or writable by "
                             "others without the sticky bit); the checked copy could be swapped before it is "
                             "served: choose a directory of your own (nothing was copied)")


def _listing(model_uri: str, source: str, tracking_uri: str | None) -> dict[str, int | None]:
    """Every file under the signed source in the store, by its ``/`` path: its size as the store lists it."""
    import mlflow.artifacts

    found: dict[str, int | None] = {}
    pending = [""]
    while pending:
        prefix = pending.pop()
        try:
            entries = mlflow.artifacts.list_artifacts(artifact_uri=f"{source.rstrip('/')}/{prefix}".rstrip("/"),
                                                      tracking_uri=tracking_uri)
        except Exception as exc:  # noqa: BLE001 - the store's own error: one line
            raise UntrustedModel(f"{model_uri}: its files could not be listed ({type(exc).__name__}); not loaded") \
                from None
        for entry in entries:
            rel = f"{prefix}/{Path(entry.path).name}".lstrip("/")
            if len(found) + len(pending) > 10_000:
                raise UntrustedModel(f"{model_uri}: more than 10,000 files in the store; not loaded")
            if entry.is_dir:
                pending.append(rel)
            else:
                found[rel] = entry.file_size
    return found


def check_listing(where: str, listed: dict[str, int | None], files: dict[str, Any]) -> None:
    """The store lists exactly the signed files, each at its signed size (where it gives one)."""
    for rel in sorted({*listed, *files}):
        if rel not in files:
            raise UntrustedModel(f"{where}: model file {shown_name(rel)}"
                                 f" was not there at registration; refusing to load the model")
        if rel not in listed:
            raise UntrustedModel(f"{where}: model file {shown_name(rel)} is missing (signed at registration); "
                                 "refusing to load the model")
        size, want = listed[rel], files[rel].get("bytes") if isinstance(files[rel], dict) else None
        if size is not None and size != want:
            raise UntrustedModel(f"{where}: model file {shown_name(rel)} does not match the sha256 "
                                 "signed at registration (replaced in the store?); refusing to load the model")


def load_model(model_uri: str, *, tracking_uri: str | None = None, dst: str | Path | None = None) -> Any:
    """``mlflow.pyfunc.load_model`` of a registered model whose files were verified first (see the module).

    The checked copy is loaded from ``dst`` when given (kept), else from a temporary directory removed
    once the model is in memory.
    """
    import mlflow.pyfunc

    if dst is not None:
        return mlflow.pyfunc.load_model(str(fetch_verified(model_uri, dst, tracking_uri=tracking_uri)))
    with tempfile.TemporaryDirectory(prefix="llmpack-verified-") as scratch:
        return mlflow.pyfunc.load_model(str(fetch_verified(model_uri, Path(scratch) / "model",
                                                           tracking_uri=tracking_uri)))


def main(argv: list[str] | None = None) -> int:
    """``python -m components.serving.verify MODEL_URI DIR``: the checked copy in DIR, or one line and exit 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m components.serving.verify models:/NAME@ALIAS DIR", file=sys.stderr)
        return 2
    registry_store.bound_retries()
    try:
        local = fetch_verified(args[0], args[1], tracking_uri=registry_store.store_uri())
    except InputError as exc:
        from components.redaction import printable

        print(f"llmpack: error: {printable(str(exc), 4000)}", file=sys.stderr)  # a store's file names: escapes as '?'
        return 2
    print(f"{args[0]}: every file matches its signed sha256; checked copy in {local} "
          f"(serve it: mlflow models serve -m {local})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
