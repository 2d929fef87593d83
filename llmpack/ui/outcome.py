"""The run's last line: what came out of it for the model (the registry's promotion decision).

The register step writes the decision into its ``registration.json``
(:func:`components.serving.promotion.Decision.phrase`); this reads it back from the run's
directory, so every local path says it the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REGISTRATION_DIR = "register.registration_dir"  # the register step's output in a local run's summary
# ... or, with the step fused into another task (``--fuse all``), that task's ``register_registration``
FUSED_REGISTRATION_DIR = ".register_registration_dir"


def promotion_phrase(summary: dict[str, Any]) -> str | None:
    """``version 3 -> champion (beat v2: ...)`` or ``version 3 stays challenger (...)``; None when nothing was registered."""
    artifacts = summary.get("artifacts") or {}
    where = artifacts.get(REGISTRATION_DIR) or next(
        (v for k, v in sorted(artifacts.items()) if k.endswith(FUSED_REGISTRATION_DIR)), None)
    if not where:
        return None
    try:
        record = json.loads((Path(where) / "registration.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # a failed run has no registration: nothing to say
        return None
    phrase = record.get("promotion") if isinstance(record, dict) else None
    return phrase if isinstance(phrase, str) else None
