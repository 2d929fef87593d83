"""docs/first-run-on-a-cluster.md cannot rot: its loopback commands run as typed and print what it shows.

Every ``bash`` block of the page's "Try it without a cluster" section that is followed by a
``text`` block runs from a directory holding the repository's folders (as links), as a user types
it from the repository root; its output must be the ``text`` block (ports aside), and its exit
code 1 exactly when a line failed. The ✗ lines and fixes the page lists for each fault are
checked against the real output in tests/llmpack/cluster/doctor/test_doctor.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from standins.loopback import CLIENT_ENV

REPO = Path(__file__).resolve().parents[4]
PAGE = REPO / "docs" / "first-run-on-a-cluster.md"
LINKED = ("kfp_pipelines", "argo_workflows", "mlflow_projects", "examples", "components", "llmpack", "tests")
PAIR = re.compile(r"^```bash\n(?P<command>.*?)^```\n+```text\n(?P<output>.*?)^```", re.S | re.M)
PORT = re.compile(r"127\.0\.0\.1:\d+")


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def tried() -> list[tuple[str, str]]:
    found = PAIR.findall(section(PAGE.read_text(encoding="utf-8"), "Try it without a cluster"))
    assert len(found) >= 2, "the page's loopback examples are gone"
    return found


@pytest.mark.parametrize("command, shown", tried(), ids=lambda v: v.strip()[:60] if "\n" not in v.strip() else None)
def test_page_commands_print_what_the_page_shows(tmp_path: Path, command: str, shown: str) -> None:
    for top in LINKED:
        (tmp_path / top).symlink_to(REPO / top)
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV and not k.startswith("LLMPACK_")}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]), HOME=str(tmp_path),
               PYTHONPATH=str(REPO), COLUMNS="200")
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert PORT.sub("127.0.0.1:PORT", done.stdout) == shown, done.stdout + done.stderr
    assert done.returncode == (1 if "\n✗ " in "\n" + shown else 0), done.stderr


def test_the_check_section_shows_the_same_output() -> None:
    text = PAGE.read_text(encoding="utf-8")
    shown = re.findall(r"^```text\n(.*?)^```", section(text, "Check it: `llmpack cluster doctor`"), re.S | re.M)
    assert shown == [tried()[0][1]]
