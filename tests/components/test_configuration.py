"""docs/configuration.md is the settings registry rendered (``python -m llmpack.configuration``), never edited
by hand."""

from __future__ import annotations

from llmpack.configuration import render
from tests.conftest import REPO


def test_configuration_page_is_the_rendered_registry() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == render(), (
        "docs/configuration.md is stale: regenerate it with `python -m llmpack.configuration > docs/configuration.md`")
