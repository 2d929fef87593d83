"""The run's last line reads the promotion decision the register step wrote, or says nothing."""

from __future__ import annotations

import json
from pathlib import Path

from llmpack.ui.outcome import REGISTRATION_DIR, promotion_phrase


def test_the_phrase_comes_from_registration_json_or_is_none(tmp_path: Path) -> None:
    (tmp_path / "registration.json").write_text(json.dumps({"promotion": "version 2 stays challenger (promote=false)"}))
    assert (promotion_phrase({"artifacts": {REGISTRATION_DIR: str(tmp_path)}})
            == "version 2 stays challenger (promote=false)")
    fused = {"artifacts": {"prepare-data-tokenize-finetune-evaluate-register.register_registration_dir": str(tmp_path)}}
    assert promotion_phrase(fused) == "version 2 stays challenger (promote=false)"  # --fuse all
    assert promotion_phrase({"artifacts": {}}) is None  # a failed run: no register output
    assert promotion_phrase({"artifacts": {REGISTRATION_DIR: str(tmp_path / "gone")}}) is None
    (tmp_path / "registration.json").write_text(json.dumps({"registered": False,
                                                            "skipped": "LLMPACK_REGISTER_VERSION=0"}))
    assert promotion_phrase({"artifacts": {REGISTRATION_DIR: str(tmp_path)}}) is None
    (tmp_path / "registration.json").write_text("[not json")
    assert promotion_phrase({"artifacts": {REGISTRATION_DIR: str(tmp_path)}}) is None


def test_no_promote_is_the_pipeline_parameter_promote_false() -> None:
    from llmpack.run.user_pipeline import parse_params
    from llmpack.ui.options import with_promote

    assert parse_params(with_promote(("lr=0.001",), True))["promote"] is False
    assert "promote" not in parse_params(with_promote(("lr=0.001",), False))
    assert parse_params(with_promote(("promote=true",), True))["promote"] is False  # the flag comes last and wins
    assert parse_params(("merge=true",))["merge"] is True


def test_the_last_line_joins_the_task_outcome_and_the_registry_decision(tmp_path) -> None:
    from llmpack.ui.outcome import REGISTRATION_DIR, outcome_line

    (tmp_path / "registration.json").write_text(json.dumps({"promotion": "version 3 -> champion (no champion yet)"}))
    summary = {"metrics": {"base_exact_match": 0.0, "tuned_exact_match": 0.17, "task_rows": 200.0,
                           "gated_by_exact_match": 1.0},
               "artifacts": {REGISTRATION_DIR: str(tmp_path)}}
    assert outcome_line(summary) == ("outcome: exact match base 0.0% -> tuned 17.0% on 200 unseen prompts "
                                     "(gate: exact match); version 3 -> champion (no champion yet)")
    assert outcome_line({"artifacts": {REGISTRATION_DIR: str(tmp_path)}}) is None  # nothing evaluated: no line
