"""examples/tutorials/show_record.py's tag lines, quick: no MLflow store (that is tests/llmpack/test_show_record.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("show_record", REPO / "examples" / "tutorials" / "show_record.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_a_pipeline_with_no_gpu_step_shows_no_unknown_price() -> None:
    """newcomer5: ``llmpack.price_per_gpu_hour unknown`` for a pipeline no step of which asks for a GPU."""
    script = _script()
    tags = {"llmpack.gpu_count": "0", "llmpack.gpu_type": "none", "llmpack.price_per_gpu_hour": "unknown",
            "llmpack.price_source": "unknown", "llmpack.status": "succeeded"}
    text = "\n".join(script.tag_lines(tags))
    assert "unknown" not in text, text
    assert "llmpack.price_per_gpu_hour" in text and "n/a (no step asks for a GPU)" in text
    gpu = {**tags, "llmpack.gpu_count": "1", "llmpack.gpu_type": "h100"}  # a GPU step with no price: unknown it is
    assert "unknown" in "\n".join(script.tag_lines(gpu))
