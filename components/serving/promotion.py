"""Promotion: every registered version is the ``challenger``; ``champion`` moves only to a better one.

The decision (:func:`decide`) is a pure function of plain values, tested case by case without a
registry; :func:`current_champion` and :func:`set_aliases` are the two registry calls around it.
Which figure decides is data (:class:`PromotionMetric`), not code; versions are compared only on
the same eval set (:func:`eval_set_fingerprint`): a champion scored on other data is not beaten or
kept by arithmetic, the new version stays ``challenger`` and its tags say why (docs/serving.md).

Only signed figures are compared: the champion's value and eval set come from its signed
provenance payload (:mod:`components.serving.signed`), never from its ``llmpack.metric.*`` tags,
which anyone who can write the registry can edit; a champion whose signature does not verify is
not compared. Two registrations at the same moment can both move the alias; the later one wins
(runs of one model name are sequential in practice, so no lock is taken).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHAMPION = "champion"
CHALLENGER = "challenger"
TAG = "llmpack.promotion"
METRIC_TAG = "llmpack.metric."  # + the figure's name, e.g. llmpack.metric.eval_loss
EVAL_SET_TAG = "llmpack.eval_set"
EVAL_SET_FILES = ("eval_input_ids.npy", "eval_labels.npy", "eval_prompts.jsonl")  # the eval split, its answers
# Figures the run's record may hold when register runs, copied onto the version (and read back
# from the champion's): the record adds cost and spin-up when the run closes, so a version
# registered inside the run has them only where an earlier step logged them.
RECORD_FIGURES = ("cost_usd", "spinup_s")


@dataclass(frozen=True, kw_only=True)
class PromotionMetric:
    """The figure that decides promotion: its name in the evaluation's ``metrics.json``, and its direction."""

    name: str
    higher_is_better: bool


# The figure the quality gate judges today is eval loss (its improvement over the base); a
# version is compared on its eval loss itself, lower is better: the improvement also moves with
# the base model's own loss, so a worse model on a worse base could beat a better one.
PROMOTION_METRIC = PromotionMetric(name="eval_loss", higher_is_better=False)


@dataclass(frozen=True, kw_only=True)
class Standing:
    """A registered version's figure as its tags hold it (the current champion's, usually)."""

    version: str
    value: float | None
    eval_set: str
    run_id: str = ""
    figures: Mapping[str, str] | None = None  # RECORD_FIGURES the version was tagged with
    untrusted: str = ""  # why its figures cannot be compared (not signed with the user's key), else empty


@dataclass(frozen=True, kw_only=True)
class Decision:
    """Whether the new version takes ``champion``, why in a few words, and the tags that say so on the version."""

    champion: bool
    reason: str
    tags: Mapping[str, str]

    def phrase(self, version: str) -> str:
        """The promotion half of the run's last line: ``version 3 -> champion (beat v2: 0.41 > 0.37)``."""
        if self.champion:
            return f"version {version} -> {CHAMPION} ({self.reason})"
        return f"version {version} stays {CHALLENGER} ({self.reason})"


def _number(value: float) -> str:
    return f"{value:.6g}"


def _exact(value: float) -> str:
    """A tag's number: every digit, so the champion's value read back is the value it was scored at."""
    return repr(float(value))


def _pair(mine: float, theirs: float) -> tuple[str, str]:
    """The two values as short as they can be and still differ (``1.23457 vs 1.23457`` says nothing)."""
    for digits in (6, 10, 17):
        a, b = f"{mine:.{digits}g}", f"{theirs:.{digits}g}"
        if a != b or mine == theirs:
            return a, b
    return a, b


def parse_figure(text: str | None) -> float | None:
    """A tag's number, or None when absent or not a finite number."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def eval_set_fingerprint(tokens_dir: str | Path) -> str:
    """``sha256:<16 hex>`` of the eval split's token ids and labels, and its prompts with their answers.

    Equal exactly when two runs scored the same data.
    """
    digest = hashlib.sha256()
    for name in EVAL_SET_FILES:
        path = Path(tokens_dir) / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"")
    return "sha256:" + digest.hexdigest()[:16]


def figure_tags(evaluation: Mapping[str, Any]) -> dict[str, str]:
    """``llmpack.metric.<name>`` for every finite number in the evaluation: what a later version compares against."""
    return {f"{METRIC_TAG}{key}": _exact(value) for key, value in sorted(evaluation.items())
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


def standing_from_tags(version: str, run_id: str, tags: Mapping[str, str], metric: PromotionMetric) -> Standing:
    return Standing(version=version, value=parse_figure(tags.get(METRIC_TAG + metric.name)),
                    eval_set=tags.get(EVAL_SET_TAG, ""), run_id=run_id,
                    figures={k: tags[f"llmpack.{k}"] for k in RECORD_FIGURES if f"llmpack.{k}" in tags})


def decide(*, metric: PromotionMetric, value: float | None, eval_set: str, passed: bool, promote: bool,
           champion: Standing | None) -> Decision:
    """Champion or challenger for a new version with ``value`` on ``eval_set``; the incumbent keeps a tie."""
    compare_sign = ">" if metric.higher_is_better else "<"
    tags = {f"{TAG}.metric": metric.name, f"{TAG}.higher_is_better": str(metric.higher_is_better).lower(),
            EVAL_SET_TAG: eval_set}
    if value is not None:
        tags[f"{TAG}.value"] = _exact(value)
    if champion is not None:
        tags[f"{TAG}.baseline_version"] = champion.version
        if champion.run_id:
            tags[f"{TAG}.baseline_run_id"] = champion.run_id
        if champion.value is not None:
            tags[f"{TAG}.baseline_value"] = _exact(champion.value)
        if champion.eval_set != eval_set:
            tags[f"{TAG}.baseline_eval_set"] = champion.eval_set or "unknown"
        for key, figure in (champion.figures or {}).items():
            tags[f"{TAG}.baseline_{key}"] = figure

    def result(is_champion: bool, reason: str) -> Decision:
        return Decision(champion=is_champion, reason=reason,
                        tags={**tags, TAG: CHAMPION if is_champion else CHALLENGER, f"{TAG}.reason": reason})

    if not promote:
        return result(False, "promote=false")
    if not passed:
        return result(False, "quality gate failed")
    if value is None or not math.isfinite(value):
        return result(False, f"no {metric.name} in the evaluation")
    if champion is None:
        return result(True, f"no {CHAMPION} yet; {metric.name} {_number(value)}")
    if champion.untrusted and champion.version == "?":  # no @champion, though versions exist
        return result(False, f"not compared: {champion.untrusted}")
    if champion.untrusted:
        return result(False, f"not compared: v{champion.version}'s figures are not signed ({champion.untrusted})")
    if not eval_set:
        return result(False, "not compared: this version's eval set is unknown (the evaluation names none)")
    if champion.eval_set != eval_set:
        return result(False, f"not compared: v{champion.version} was scored on another eval set "
                             f"({champion.eval_set or 'unknown'}, this one {eval_set})")
    if champion.value is None:
        return result(False, f"not compared: v{champion.version} has no {metric.name}")
    mine, theirs = _pair(value, champion.value)
    better = value > champion.value if metric.higher_is_better else value < champion.value
    if better:
        return result(True, f"beat v{champion.version}: {mine} {compare_sign} {theirs}")
    if value == champion.value:
        return result(False, f"tied v{champion.version}: {mine} = {theirs}")
    return result(False, f"did not beat v{champion.version}: {mine} vs {theirs}, "
                         f"{'higher' if metric.higher_is_better else 'lower'} wins")


def _no_alias(exc: Exception) -> bool:
    """Whether a lookup failed because the model or the alias does not exist (MLflow: 404, or 400 for an alias)."""
    status = getattr(exc, "status", None)  # components.record.rest.RestError
    if status is None and hasattr(exc, "get_http_status_code"):  # mlflow.exceptions.MlflowException
        status = exc.get_http_status_code()
    return status in (400, 404)


def current_champion(mc: Any, model_name: str, metric: PromotionMetric) -> Standing | None:
    """The version ``champion`` points at, as a :class:`Standing` of its signed figures, or None when there is none.

    Its value and eval set come from its verified provenance payload; a champion whose signature
    does not verify is a :class:`Standing` with ``untrusted`` saying why (never compared).
    """
    from components.serving import signed

    try:
        mv = mc.get_model_version_by_alias(model_name, CHAMPION)
    except Exception as exc:
        if not _no_alias(exc):
            raise
        if not _has_versions(mc, model_name):
            return None  # the first version: no champion yet
        # versions, yet no @champion: deleted by someone (one request, no key); never "no champion yet"
        return Standing(version="?", value=None, eval_set="", untrusted=(
            "the model has versions but no @champion (removed by someone else?); promote one by hand: "
            f"python -m components.serving.promote {model_name} VERSION"))
    version, run_id, tags = str(mv.version), str(mv.run_id or ""), dict(mv.tags or {})
    try:
        payload = signed.verified_version(f"model {model_name}", name=model_name, version=version, run_id=run_id,
                                          source=getattr(mv, "source", None), tags=tags)
        # the alias is anyone's to move: compared only when the user's key made this version champion
        signed.verified_champion(f"model {model_name}", name=model_name, version=version, run_id=run_id,
                                 model_tags=model_tags(mc, model_name))
    except signed.UntrustedModel as exc:
        loose = standing_from_tags(version, run_id, tags, metric)
        return Standing(version=version, value=None, eval_set=loose.eval_set, run_id=run_id, figures=loose.figures,
                        untrusted=exc.reason)
    figures = payload.get("figures") if isinstance(payload.get("figures"), dict) else {}
    trusted = {**{k: v for k, v in tags.items() if k.startswith("llmpack.") and k.removeprefix("llmpack.")
                  in RECORD_FIGURES},
               **{METRIC_TAG + k: _exact(v) for k, v in figures.items() if isinstance(v, (int, float))},
               EVAL_SET_TAG: str(payload.get("eval_set") or "")}
    return standing_from_tags(version, run_id, trusted, metric)


def _has_versions(mc: Any, model_name: str) -> bool:
    """Whether the registered model exists with a version (MLflow's client, or the REST one)."""
    try:
        if hasattr(mc, "get_registered_model"):
            return bool(mc.get_registered_model(model_name).latest_versions)
        found = mc.call("GET", "registered-models/get", {"name": model_name}).get("registered_model", {})
        return bool(found.get("latest_versions"))
    except Exception as exc:
        if _no_alias(exc):  # no such registered model
            return False
        raise


def set_version_tag(mc: Any, model_name: str, version: str, key: str, value: str) -> None:
    """One tag on a model version, with MLflow's client or the REST one (``model-versions/set-tag``)."""
    if hasattr(mc, "set_model_version_tag"):
        mc.set_model_version_tag(model_name, version, key, value)
    else:
        mc.call("POST", "model-versions/set-tag", {"name": model_name, "version": str(version), "key": key,
                                                   "value": value})


def set_model_tag(mc: Any, model_name: str, key: str, value: str) -> None:
    """One tag on a registered model, with MLflow's client or the REST one (``registered-models/set-tag``)."""
    if hasattr(mc, "set_registered_model_tag"):
        mc.set_registered_model_tag(model_name, key, value)
    else:
        mc.call("POST", "registered-models/set-tag", {"name": model_name, "key": key, "value": value})


def model_tags(mc: Any, model_name: str) -> dict[str, str]:
    """The registered model's tags, with MLflow's client or the REST one (``registered-models/get``)."""
    if hasattr(mc, "get_registered_model"):
        return dict(mc.get_registered_model(model_name).tags or {})
    found = mc.call("GET", "registered-models/get", {"name": model_name}).get("registered_model", {})
    return {t["key"]: t.get("value", "") for t in found.get("tags", []) if isinstance(t, dict) and "key" in t}


def set_aliases(mc: Any, model_name: str, version: str, decision: Decision, *, run_id: str) -> None:
    """``challenger`` on the new version always; ``champion`` too when the decision says so, after the signed
    record of that promotion (:func:`components.serving.signed.champion_tags`) the alias is trusted by."""
    from components.serving import signed

    mc.set_registered_model_alias(model_name, CHALLENGER, version)
    if decision.champion:
        for key, value in signed.champion_tags(model_name, version, run_id).items():
            set_model_tag(mc, model_name, key, value)
        mc.set_registered_model_alias(model_name, CHAMPION, version)
