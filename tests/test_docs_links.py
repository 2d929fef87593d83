"""Every link in the docs lands: relative Markdown links and their #anchors, and every ``docs/*.md`` the code names.

Checked: each tracked ``*.md`` (README, docs/, docs/internals/, examples/, mlflow_projects/): a relative
link ``[text](path#anchor)`` names a file or folder that exists, and an anchor names a heading of the target
page (GitHub's slugs: lower case, punctuation dropped, spaces to ``-``, ``-1`` for a repeat). And each
``docs/....md`` written in a source, config or Markdown file names a page that exists, so a page moved or
merged cannot leave a pointer behind. docs/ holds at most 14 pages (the index included); the rest is
``docs/internals/``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)\)")
DOC_PATH = re.compile(r"(?<![\w./-])docs/[\w/.-]*?\.md(?:#[\w-]+)?")
SOURCES = (".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".cfg", ".txt")


def _tracked(*suffixes: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    names = [n for n in out if n.endswith(suffixes) or Path(n).name in {"Makefile", "Dockerfile"}
             or n.startswith(".ci/")]
    return [REPO / n for n in names if (REPO / n).is_file() and "golden" not in n and "/fixtures/" not in n]


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return "\n".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if i % 2 == 0)


def slugs(text: str) -> set[str]:
    """The anchors GitHub makes for a page's headings."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _prose(text).splitlines():
        if m := re.match(r"#{1,6} +(.*?)\s*#*\s*$", line):
            base = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    return out


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else p.name


def broken_links(pages: list[Path]) -> list[str]:
    broken = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(_prose(text)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{_rel(page)}: ({target})"
            if not dest.exists():
                broken.append(f"{where} no such file")
            elif anchor and dest.suffix == ".md" and anchor not in slugs(dest.read_text(encoding="utf-8")):
                broken.append(f"{where} no heading #{anchor}")
    return broken


def stale_doc_paths(files: list[Path]) -> list[str]:
    stale = []
    for f in files:
        for ref in DOC_PATH.findall(f.read_text(encoding="utf-8", errors="replace")):
            path, _, anchor = ref.partition("#")
            if not (REPO / path).is_file():
                stale.append(f"{_rel(f)}: {ref} no such page")
            elif anchor and anchor not in slugs((REPO / path).read_text(encoding="utf-8")):
                stale.append(f"{_rel(f)}: {ref} no such heading")
    return stale


def test_every_markdown_link_lands() -> None:
    assert broken_links(_tracked(".md")) == []


def test_every_docs_path_named_in_the_repo_exists() -> None:
    assert stale_doc_paths([f for f in _tracked(*SOURCES) if f.name != Path(__file__).name]) == []


def test_docs_holds_at_most_14_pages_and_an_index_with_its_sections() -> None:
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert len(pages) <= 14, pages
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    assert re.findall(r"^## (\w[\w ]*)$", index, re.M) == ["Start", "Guides", "Cluster lab", "Reference", "Internals"]
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(index)}
    assert set(pages) - {"README.md"} <= linked, "every page is in the index"
    assert {p.name for p in (REPO / "docs" / "internals").glob("*.md")} <= linked


def test_the_checks_find_a_broken_link_and_a_stale_path(tmp_path: Path) -> None:
    (tmp_path / "cli.md").write_text("# The command line\n")
    page = tmp_path / "planted.md"
    page.write_text("# Planted\n\n[gone](gone.md) [cli](cli.md#no-such-heading) [ok](#planted) [cli](cli.md)\n"
                    "```\n[in code](nowhere.md)\n```\nsee docs/nowhere.md, docs/cli.md and kubernetes.io/docs/x.md\n")
    assert broken_links([page]) == ["planted.md: (gone.md) no such file",
                                    "planted.md: (cli.md#no-such-heading) no heading #no-such-heading"]
    assert stale_doc_paths([page]) == ["planted.md: docs/nowhere.md no such page"]
    assert slugs("# A `b`, c/d (e)\n## A b c/d (e)\n") == {"a-b-cd-e", "a-b-cd-e-1"}


def test_the_readme_is_a_small_front_door() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    quickstart = readme.partition("\n## Quickstart\n")[2].partition("\n## ")[0]
    commands = re.search(r"^```bash\n(.*?)^```", quickstart, re.S | re.M)
    assert commands and [line.split("#")[0].strip() for line in commands.group(1).splitlines()] == [
        "make compare", "make test"]
    assert "`.venv/bin/llmpack" in quickstart and "`. .venv/bin/activate`" in quickstart
    assert "make cluster-up" in readme
