"""Signed evaluations and signed model versions: what register and the verified loader trust.

Two kinds of :mod:`components.provenance` signature (HMAC with the user's key):

- ``evaluation``: evaluate signs its ``metrics.json`` (every figure, the gate's settings, the eval
  set) with the sha256 of every model file it scored and the pipeline run, in
  ``metrics.signature.json`` beside it. Register verifies it before anything is logged, checks the
  model it registers is the one scored, and recomputes the gate from the signed figures.
- ``model-version``: register signs each version's name, version, run id and source, the sha256
  and size of every file of the logged model, and the figures promotion compares; payload and
  signature are the version's tags :data:`PAYLOAD_TAG` and :data:`SIGNATURE_TAG`. The verified
  loader (:mod:`components.serving.verify`) and promotion read nothing else of a version as fact.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components import bounded, provenance
from components.errors import InputError
from components.redaction import printable

EVALUATION = "evaluation"
MODEL_VERSION = "model-version"
EVALUATION_FILE = "metrics.json"
SIGNATURE_FILE = "metrics.signature.json"  # beside metrics.json: the files scored, the run, the signature
SIGNATURE_FIELD = "signature"
PAYLOAD_TAG = "llmpack.provenance"  # on a model version: the signed payload, canonical JSON
SIGNATURE_TAG = "llmpack.provenance.signature"
MAX_PAYLOAD_CHARS = 1 << 20
_CHUNK = 1 << 20


class UntrustedModel(InputError):
    """A registered model whose files or figures are not the ones its registration signed; ``reason``: the short why."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def _untrusted(where: str, version: str, reason: str) -> UntrustedModel:
    return UntrustedModel(f"{where}: version {version}: {reason}; refusing to trust it", reason)


def shown_name(rel: str) -> str:
    """A model file's name in a message: a store's name, its escape bytes as '?'."""
    return printable(rel, 300)


def file_digest(path: Path) -> dict[str, Any]:
    """``{"sha256": hex, "bytes": n}`` of a regular file (a symlink, FIFO or device is refused)."""
    fd = bounded.open_regular(path)
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"sha256": digest.hexdigest(), "bytes": size}


def tree_digests(root: Path, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every file under ``root`` by its ``/``-separated path (``prefix`` first): the digest of each.

    A symlink or anything but a regular file or directory under ``root`` is one :class:`InputError`.
    """
    out: dict[str, dict[str, Any]] = {}
    for directory, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(directory) / name
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            rel = prefix + path.relative_to(root).as_posix()
            if not stat.S_ISREG(mode):
                raise InputError(f"{rel}: not a regular file (a symlink, FIFO or device is refused in a model)")
            out[rel] = file_digest(path)
    return out


def model_files(model_dir: Path, weights: str, meta_name: str) -> dict[str, dict[str, Any]]:
    """The files that are the tuned model: its metadata file and its weights directory (``adapter`` or ``full``)."""
    return {meta_name: file_digest(model_dir / meta_name), **tree_digests(model_dir / weights, f"{weights}/")}


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (a diverged loss) replaced by None: what can be signed and read back."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def figures(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """The evaluation's finite numbers (not booleans): what promotion may compare."""
    return {k: float(v) for k, v in sorted(evaluation.items())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


# --------------------------------------------------------------------------- evaluations


def sign_evaluation(result: Mapping[str, Any], *, model: Mapping[str, Any],
                    pipeline_run: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``metrics.json``'s content (NaN and infinity as null) and its :data:`SIGNATURE_FILE`'s.

    The signature covers the figures, the sha256 of every model file scored and the pipeline run;
    it lives beside ``metrics.json`` so the figures stay byte-identical on every path.
    """
    metrics = finite(dict(result))
    bound = {"model_files": dict(model), "pipeline_run": pipeline_run}
    return metrics, {**bound, SIGNATURE_FIELD: provenance.sign(EVALUATION, {"metrics": metrics, **bound})}


def verified_evaluation(metrics_dir: Path, *, model: Mapping[str, Any], pipeline_run: str) -> dict[str, Any]:
    """The evaluation in ``metrics_dir``, when the user's key signed it for these model files and this run.

    Else one :class:`InputError` line: unsigned or edited (a figure, ``passed``, ``eval_set``), of
    other model files, or of another pipeline run (one signed with no run name is taken in any).
    """
    path = metrics_dir / EVALUATION_FILE
    metrics = bounded.read_json(path)
    signature = metrics_dir / SIGNATURE_FILE
    seal = bounded.read_json(signature) if signature.exists() or signature.is_symlink() else {}
    if not isinstance(metrics, dict) or not isinstance(seal, dict):
        raise InputError(f"{path}: not an evaluation (a JSON object is expected)")
    bound = {"model_files": seal.get("model_files"), "pipeline_run": seal.get("pipeline_run")}
    if not provenance.verify(EVALUATION, {"metrics": metrics, **bound}, seal.get(SIGNATURE_FIELD)):
        raise InputError(f"{path}: not signed by this environment's key (edited, forged or written by hand); "
                         "nothing registered or promoted")
    scored = bound["model_files"] if isinstance(bound["model_files"], dict) else {}
    if scored != dict(model):
        changed = sorted(k for k in {*scored, *model} if scored.get(k) != model.get(k))
        raise InputError(f"{path}: the evaluation scored other model files ({', '.join(changed[:3])} differ); "
                         "nothing registered or promoted")
    signed_run = str(bound["pipeline_run"] or "")
    if signed_run and pipeline_run and signed_run != pipeline_run:  # (one made by hand, outside any run: taken)
        raise InputError(f"{path}: the evaluation is of pipeline run {signed_run!r}, not {pipeline_run!r}; "
                         "nothing registered or promoted")
    return metrics


def gate_passed(evaluation: Mapping[str, Any]) -> bool:
    """The quality gate recomputed from the signed figures (never from a ``passed`` field)."""
    from components.training.generation import gate_improvement

    gate, floor = evaluation.get("gate_metric"), evaluation.get("min_improvement")
    try:
        improvement = gate_improvement(str(gate), dict(evaluation))
    except (KeyError, TypeError):
        return False
    numbers = (improvement, floor)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in numbers):
        return False
    return float(improvement) >= float(floor)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- model versions


def version_payload(*, name: str, version: str, run_id: str, source: str, files: Mapping[str, Any],
                    evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """What a model version's signature covers."""
    return {"name": name, "version": str(version), "run_id": run_id, "source": source, "files": dict(files),
            "eval_set": str(evaluation.get("eval_set") or ""), "figures": figures(evaluation)}


def version_tags(payload: Mapping[str, Any]) -> dict[str, str]:
    """The two tags that carry a version's provenance."""
    return {PAYLOAD_TAG: provenance.canonical(payload).decode(), SIGNATURE_TAG: provenance.sign(MODEL_VERSION, payload)}


def verified_version(where: str, *, name: str, version: str, run_id: str, source: str | None,
                     tags: Mapping[str, str]) -> dict[str, Any]:
    """The version's signed payload, when its signature is the user's and it names this very version.

    ``source`` None: not checked (a client that does not return it). Else one :class:`UntrustedModel`.
    """
    text = tags.get(PAYLOAD_TAG)
    if not text or SIGNATURE_TAG not in tags:
        raise _untrusted(where, version, f"no provenance signature (registered before signing, or its "
                                         f"{PAYLOAD_TAG} tags removed)")
    if len(text) > MAX_PAYLOAD_CHARS:
        raise _untrusted(where, version, f"its {PAYLOAD_TAG} tag is over {MAX_PAYLOAD_CHARS} characters")
    try:
        payload = bounded.loads(text, f"tag {PAYLOAD_TAG}")
    except InputError as exc:
        raise _untrusted(where, version, str(exc)) from None
    if not isinstance(payload, dict) or not provenance.verify(MODEL_VERSION, payload, tags.get(SIGNATURE_TAG)):
        raise _untrusted(where, version, "its provenance signature does not verify with this environment's key "
                                         "(tags edited, or signed with another key)")
    actual = {"name": name, "version": str(version), "run_id": run_id, **({"source": source} if source else {})}
    for key, value in actual.items():
        if payload.get(key) != value:
            raise _untrusted(where, version, f"signed for {key} {payload.get(key)!r}, but the registry says {value!r}")
    if not isinstance(payload.get("files"), dict) or not payload["files"]:
        raise _untrusted(where, version, "its signed payload lists no model files")
    return payload


# The promotion itself, signed: a registered-model tag naming the version the user's key made champion. An alias
# is anyone's to move (one request to the store); the alias is trusted only where this record names its version.
CHAMPION_KIND = "champion"
CHAMPION_TAG = "llmpack.champion"
CHAMPION_SIGNATURE_TAG = "llmpack.champion.signature"


def champion_tags(name: str, version: str, run_id: str) -> dict[str, str]:
    """The registered model's tags that record, signed, that ``version`` (of run ``run_id``) was made champion by
    this key. The run id binds the record to this store's version: copied to another store, or kept over a model
    deleted and registered again (its versions numbered from 1 again), it names a run that version is not of."""
    import time

    payload = {"name": name, "version": str(version), "run_id": str(run_id), "promoted_at": round(time.time(), 3)}
    return {CHAMPION_TAG: provenance.canonical(payload).decode(),
            CHAMPION_SIGNATURE_TAG: provenance.sign(CHAMPION_KIND, payload)}


def verified_champion(where: str, *, name: str, version: str, run_id: str,
                      model_tags: Mapping[str, str]) -> dict[str, Any]:
    """The signed promotion record when ``version`` (of run ``run_id``) is the one the user's key made champion of
    ``name``; else one :class:`UntrustedModel`.

    Moving ``@champion`` (to an older version, or to one registered with ``--no-promote``) needs no key;
    this record does, and it names the version's run (a record copied from another store, or from before the
    model was deleted and registered again, is refused). Putting back this store's own earlier record with its
    alias (a rollback to an earlier champion) is not told apart: the store keeps no order the key signs; the
    record's ``promoted_at`` is printed by the loader so a rollback shows as an older promotion.
    """
    text = model_tags.get(CHAMPION_TAG) or ""
    try:
        payload = bounded.loads(text, f"tag {CHAMPION_TAG}") if 0 < len(text) <= MAX_PAYLOAD_CHARS else None
    except InputError:
        payload = None
    if not isinstance(payload, dict) or not provenance.verify(CHAMPION_KIND, payload,
                                                               model_tags.get(CHAMPION_SIGNATURE_TAG)):
        raise _untrusted(where, version, "@champion points at it, but no promotion signed with this environment's "
                                         f"key says so (its {CHAMPION_TAG} tag missing or edited; the alias moved "
                                         "by someone else?)")
    if payload.get("name") != name or payload.get("version") != str(version):
        raise _untrusted(where, version, f"@champion points at it, but this environment's key made version "
                                         f"{payload.get('version')!r} champion (the alias moved by someone else?)")
    if payload.get("run_id") != str(run_id):
        raise _untrusted(where, version, "@champion points at it, but the signed promotion record names another "
                                         "run than this version's (copied from another store, or from before the "
                                         "model was registered again?)")
    return payload


def check_files(where: str, local: Path, files: Mapping[str, Any]) -> None:
    """``local`` holds exactly the signed files, byte for byte; else one :class:`UntrustedModel` naming the file.

    Sizes are compared before any byte is hashed; nothing under ``local`` is imported or parsed.
    """
    found: dict[str, Path] = {}
    for directory, dirs, names in os.walk(local):
        for entry in sorted(dirs + names):
            path = Path(directory) / entry
            rel = path.relative_to(local).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise UntrustedModel(f"{where}: model file {shown_name(rel)}"
                                     f" is not a regular file; refusing to load the model")
            found[rel] = path
    for rel in sorted({*files, *found}):
        if rel not in found:
            raise UntrustedModel(f"{where}: model file {shown_name(rel)} is missing (signed at registration); "
                                 "refusing to load the model")
        if rel not in files:
            raise UntrustedModel(f"{where}: model file {shown_name(rel)} was not there at registration; "
                                 "refusing to load the model")
        want = files[rel] if isinstance(files[rel], dict) else {}
        if found[rel].lstat().st_size != want.get("bytes") or file_digest(found[rel]) != want:
            raise UntrustedModel(f"{where}: model file {shown_name(rel)} does not match the sha256 "
                                 "signed at registration (replaced in the store?); refusing to load the model")
