"""How a local compare ended, on the record: what ``llmpack report --run-group`` cannot tell from the runs alone.

A compare until decided knows its budget (raised on a slow machine), its design (the rounds that budget holds),
what warm-up and round 1 cost (``plan``), how long it took and why it stopped only once its runs are done; a
compare that stopped after round 1 has no start-up run to carry them (trial 11). So when the compare ends,
:func:`record_outcome` tags every run it counted with :data:`OUTCOME_TAG`: those values as JSON (redacted,
at most :data:`MAX_CHARS` characters), and :func:`read_outcome` gives them back, checked, to the rebuild
(:mod:`llmpack.compare.rebuilt`). Imports nothing of ``llmpack.compare`` but the comparison's constants.
"""

from __future__ import annotations

import json
import math
from typing import Any

OUTCOME_TAG = "llmpack.compare_outcome"
MAX_CHARS = 4000
# the result's keys the tag carries (those a compare has: --repeats has rounds/stopped only when it stopped early)
KEYS = ("rounds", "stopped", "stopped_why", "budget_s", "budget_adapted", "elapsed_s", "plan", "max_steps",
        "injected_start_delay_s")


def outcome_tag(result: dict[str, Any]) -> dict[str, str]:
    """``{OUTCOME_TAG: JSON}`` of the result's :data:`KEYS` and its design's rounds, redacted; {} when too long."""
    from components.redaction import redact_data

    values = {k: result[k] for k in KEYS if k in result}
    if result.get("design"):
        values["design_rounds"] = result["design"].get("max_rounds")
    text = json.dumps(redact_data(values), sort_keys=True, default=str)
    if len(text) > MAX_CHARS and "stopped_why" in values:  # an error's text is the one unbounded value
        values["stopped_why"] = str(values["stopped_why"])[:500]
        text = json.dumps(redact_data(values), sort_keys=True, default=str)
    return {OUTCOME_TAG: text} if len(text) <= MAX_CHARS else {}


def record_outcome(result: dict[str, Any], tracking_uri: str | None) -> bool:
    """Tag the compare's counted runs (those MLflow holds) with :func:`outcome_tag`; best effort: False when not
    every run could be tagged (the rebuild then lists the values in ``not_recorded``)."""
    from components.record import tracking

    tag = outcome_tag(result)
    ids = [r["artifacts"]["mlflow_run_id"] for r in result.get("runs", ())
           if r.get("tracking") == "sent" and (r.get("artifacts") or {}).get("mlflow_run_id")]
    if not tag or not ids:
        return False
    try:
        mc = tracking.client(tracking.tracking_uri(tracking_uri))
        for run_id in ids:
            tracking.set_tags(mc, run_id, tag)
    except Exception:  # noqa: BLE001 - the compare's result stands; the rebuild says what it could not read
        return False
    return len(ids) == len(result.get("runs", ()))


def read_outcome(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The outcome the runs carry (store data: one JSON object every run that has the tag agrees on, its values
    checked), else None."""
    texts = {(r.get("tags") or {}).get(OUTCOME_TAG) for r in runs} - {None}
    if len(texts) != 1:
        return None
    text = next(iter(texts))
    try:
        raw = json.loads(text) if isinstance(text, str) and len(text) <= MAX_CHARS else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    checks = {"rounds": _count, "stopped": _word, "stopped_why": _text, "budget_s": _seconds,
              "elapsed_s": _seconds, "max_steps": _count, "design_rounds": _count, "plan": _plan,
              "budget_adapted": _adapted, "injected_start_delay_s": _delays}
    out: dict[str, Any] = {}
    for key, check in checks.items():
        if key in raw:
            ok, value = (True, None) if raw[key] is None else check(raw[key])
            if ok:
                out[key] = value
    return out


def _count(v: Any) -> tuple[bool, Any]:
    return (type(v) is int and 0 <= v <= 1_000_000), v


def _seconds(v: Any) -> tuple[bool, Any]:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1e9), v


def _word(v: Any) -> tuple[bool, Any]:
    return (isinstance(v, str) and len(v) <= 40 and v.replace(" ", "").isalpha()), v


def _text(v: Any) -> tuple[bool, Any]:
    return (isinstance(v, str) and len(v) <= 1000), v


def _numbers(v: Any, keys: int = 50) -> bool:
    return isinstance(v, dict) and len(v) <= keys and all(
        isinstance(k, str) and len(k) <= 200 and _seconds(x)[0] for k, x in v.items())


def _plan(v: Any) -> tuple[bool, Any]:
    if not isinstance(v, dict) or len(v) > 10:
        return False, None
    ok = all(x is None or _seconds(x)[0] for k, x in v.items() if k != "path_round_s")
    return ok and _numbers(v.get("path_round_s", {})), v


def _adapted(v: Any) -> tuple[bool, Any]:
    ok = isinstance(v, dict) and set(v) == {"from_s", "to_s", "text"} and _seconds(v["from_s"])[0] \
        and _seconds(v["to_s"])[0] and _text(v["text"])[0]
    return ok, v


def _delays(v: Any) -> tuple[bool, Any]:
    return _numbers(v), v
