"""The promotion decision from plain values: who takes ``champion``, and the tags that say why."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from components.serving.promotion import (
    CHALLENGER,
    CHAMPION,
    EVAL_SET_TAG,
    PromotionMetric,
    Standing,
    decide,
    eval_set_fingerprint,
    figure_tags,
    standing_from_tags,
)

LOSS = PromotionMetric(name="eval_loss", higher_is_better=False)
MATCH = PromotionMetric(name="exact_match", higher_is_better=True)
SET = "sha256:0123456789abcdef"


def champ(value: float | None, eval_set: str = SET) -> Standing:
    return Standing(version="2", value=value, eval_set=eval_set, run_id="r2", figures={"cost_usd": "0.01"})


def test_no_champion_promotes_and_says_so() -> None:
    d = decide(metric=LOSS, value=1.5, eval_set=SET, passed=True, promote=True, champion=None)
    assert d.champion and d.tags["llmpack.promotion"] == CHAMPION
    assert d.reason.startswith("no champion yet") and d.tags[EVAL_SET_TAG] == SET
    assert "llmpack.promotion.baseline_version" not in d.tags
    assert d.phrase("1") == "version 1 -> champion (no champion yet; eval_loss 1.5)"


def test_a_better_value_takes_champion_in_the_metric_s_direction() -> None:
    lower = decide(metric=LOSS, value=1.2, eval_set=SET, passed=True, promote=True, champion=champ(1.4))
    assert lower.champion and lower.reason == "beat v2: 1.2 < 1.4"
    assert lower.tags["llmpack.promotion.baseline_value"] == "1.4"
    assert lower.tags["llmpack.promotion.baseline_run_id"] == "r2"
    assert lower.tags["llmpack.promotion.baseline_cost_usd"] == "0.01"
    higher = decide(metric=MATCH, value=0.41, eval_set=SET, passed=True, promote=True, champion=champ(0.37))
    assert higher.phrase("3") == "version 3 -> champion (beat v2: 0.41 > 0.37)"
    worse = decide(metric=MATCH, value=0.30, eval_set=SET, passed=True, promote=True, champion=champ(0.37))
    assert not worse.champion and worse.tags["llmpack.promotion"] == CHALLENGER
    assert worse.phrase("3") == "version 3 stays challenger (did not beat v2: 0.3 vs 0.37, higher wins)"


def test_a_tie_keeps_the_incumbent() -> None:
    d = decide(metric=LOSS, value=1.4, eval_set=SET, passed=True, promote=True, champion=champ(1.4))
    assert not d.champion and d.reason == "tied v2: 1.4 = 1.4"


def test_a_champion_on_another_eval_set_is_not_compared() -> None:
    d = decide(metric=LOSS, value=0.1, eval_set=SET, passed=True, promote=True, champion=champ(9.0, "sha256:other"))
    assert not d.champion and d.reason.startswith("not compared: v2 was scored on another eval set")
    assert d.tags["llmpack.promotion.baseline_eval_set"] == "sha256:other"
    unknown = decide(metric=LOSS, value=0.1, eval_set=SET, passed=True, promote=True, champion=champ(9.0, ""))
    assert not unknown.champion and "(unknown, this one" in unknown.reason


def test_a_version_without_an_eval_set_is_not_compared_with_a_champion() -> None:
    d = decide(metric=LOSS, value=0.1, eval_set="", passed=True, promote=True, champion=champ(9.0))
    assert not d.champion and "this version's eval set is unknown" in d.reason
    assert decide(metric=LOSS, value=0.1, eval_set="", passed=True, promote=True, champion=None).champion


def test_values_are_tagged_exactly_and_shown_as_short_as_still_tells_them_apart() -> None:
    d = decide(metric=LOSS, value=5.1028931, eval_set=SET, passed=True, promote=True, champion=champ(5.102893))
    assert d.reason == "did not beat v2: 5.1028931 vs 5.102893, lower wins"
    assert float(d.tags["llmpack.promotion.value"]) == 5.1028931
    tied = standing_from_tags("2", "r2", {**figure_tags({"eval_loss": 5.102893123456789}), EVAL_SET_TAG: SET}, LOSS)
    again = decide(metric=LOSS, value=5.102893123456789, eval_set=SET, passed=True, promote=True, champion=tied)
    assert again.reason == "tied v2: 5.10289 = 5.10289"  # the tag read back is the value scored


def test_a_champion_without_the_metric_is_not_compared() -> None:
    d = decide(metric=MATCH, value=0.9, eval_set=SET, passed=True, promote=True, champion=champ(None))
    assert not d.champion and d.reason == "not compared: v2 has no exact_match"


def test_a_failed_gate_or_promote_false_stays_challenger_even_without_a_champion() -> None:
    gate = decide(metric=LOSS, value=0.1, eval_set=SET, passed=False, promote=True, champion=None)
    assert not gate.champion and gate.reason == "quality gate failed"
    off = decide(metric=LOSS, value=0.1, eval_set=SET, passed=True, promote=False, champion=None)
    assert not off.champion and off.tags["llmpack.promotion.reason"] == "promote=false"
    missing = decide(metric=MATCH, value=None, eval_set=SET, passed=True, promote=True, champion=None)
    assert not missing.champion and missing.reason == "no exact_match in the evaluation"


def test_tags_round_trip_to_a_standing() -> None:
    tags = {**figure_tags({"eval_loss": 1.25, "passed": True, "note": "x", "nan": float("nan")}), EVAL_SET_TAG: SET,
            "llmpack.cost_usd": "0.02"}
    assert set(figure_tags({"eval_loss": 1.25, "passed": True, "nan": float("nan")})) == {"llmpack.metric.eval_loss"}
    standing = standing_from_tags("4", "r4", tags, LOSS)
    assert standing == Standing(version="4", value=1.25, eval_set=SET, run_id="r4", figures={"cost_usd": "0.02"})
    assert standing_from_tags("4", "r4", tags, MATCH).value is None


def test_the_eval_set_fingerprint_follows_the_eval_tokens_only(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "eval_input_ids.npy", np.arange(6, dtype=np.int64))
        np.save(tmp_path / name / "eval_labels.npy", np.arange(6, dtype=np.int64))
        np.save(tmp_path / name / "train_input_ids.npy", np.arange(6 if name == "a" else 7, dtype=np.int64))
    assert eval_set_fingerprint(tmp_path / "a") == eval_set_fingerprint(tmp_path / "b")
    np.save(tmp_path / "b" / "eval_labels.npy", np.arange(1, 7, dtype=np.int64))
    assert eval_set_fingerprint(tmp_path / "a") != eval_set_fingerprint(tmp_path / "b")
    assert eval_set_fingerprint(tmp_path / "a").startswith("sha256:")


def test_a_deleted_champion_alias_is_never_no_champion_yet() -> None:
    """Round 16 (C1, helper-39): deleting @champion (one store request, no key) made the next version champion as
    "no champion yet", a worse one included. With versions registered and no alias, nothing is compared and the
    new version stays challenger; only a model without versions has no champion yet."""
    from types import SimpleNamespace

    from components.serving import promotion

    class Gone(Exception):
        status = 404

    class Store:
        def __init__(self, versions: list[str]) -> None:
            self.versions = versions

        def get_model_version_by_alias(self, name: str, alias: str) -> None:
            raise Gone()

        def get_registered_model(self, name: str) -> SimpleNamespace:
            if not self.versions:
                raise Gone()
            return SimpleNamespace(latest_versions=self.versions, tags={})

    metric = promotion.PROMOTION_METRIC
    assert promotion.current_champion(Store([]), "m", metric) is None
    standing = promotion.current_champion(Store(["1", "2"]), "m", metric)
    assert standing is not None and "no @champion" in standing.untrusted
    decision = promotion.decide(metric=metric, value=1.0, eval_set="sha256:x", passed=True, promote=True,
                                champion=standing)
    assert not decision.champion and "promote one by hand" in decision.phrase("3")
