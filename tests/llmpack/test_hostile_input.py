"""Hostile input on every surface: one line naming the problem, exit 2, nothing half-written.

Each row of :data:`CASES` builds its input in a fresh directory and runs the real command there
(``llmpack``, or a local runner's ``python -m`` entry point) in a subprocess. A row passes when the
command exits 2 with exactly one non-empty stderr line, ``llmpack: error: ...``, that contains the
row's ``expect`` text, prints nothing on stdout, and leaves the directory exactly as it found it.
Every row fails during validation, before any pipeline step could start.

The table of what was observed is ``docs/internals/hostile-input.md``; ``LLMPACK_REGEN_GOLDEN=1`` rewrites it
(``make golden``). The cases themselves are in ``tests/llmpack/hostile_cases.py``; Hypothesis
properties of the readers are in ``tests/llmpack/test_hostile_properties.py``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.llmpack.hostile_cases import CANARY, CASES, DROP_READ_CAPS, ELSEWHERE, PROGRAMS, Case

TABLE = REPO / "docs" / "internals" / "hostile-input.md"
REGEN_ENV = "LLMPACK_REGEN_GOLDEN"
# The page's generated table ends here; what follows (cases that are more than one line and exit 2,
# each naming its test) is kept by hand and left as it is by a regeneration.
KEPT_BY_HAND = "\n## Kept by hand"


# --------------------------------------------------------------------------- running a case


@dataclass(frozen=True, kw_only=True)
class Observed:
    returncode: int
    stdout: str
    stderr: str
    before: dict[str, tuple[int, int, int]]
    after: dict[str, tuple[int, int, int]]
    skipped: str = ""


# Where no tmpfs can be mounted: every write under the "full" directory fails as a full disk would.
_SIMULATED_FULL_DISK = """
import builtins, errno, io, os, sys
full, argv = os.path.abspath(sys.argv[1]), sys.argv[2:]
real_open = io.open
def open_on_full_disk(file, mode="r", *args, **kwargs):
    if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and \\
            os.path.abspath(os.fspath(file)).startswith(full + os.sep):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(file))
    return real_open(file, mode, *args, **kwargs)
builtins.open = io.open = open_on_full_disk
sys.argv = ["llmpack", *argv]
from llmpack.cli import main
main()
"""


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` (links not followed) with its mode, and a file's size and modification time.

    A directory's own times change when something is created in it and removed again, which leaves
    nothing behind; only its existence and mode count.
    """
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        is_dir = stat.S_ISDIR(info.st_mode)
        out[str(path.relative_to(root))] = (info.st_mode, 0 if is_dir else info.st_size,
                                            0 if is_dir else info.st_mtime_ns)
    return out


def _env(case: Case) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_", "KFP_", "ARGO_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **case.env}


def _mount_full_disk(path: Path) -> bool:
    """A 64 KiB tmpfs at ``path`` (too small for the compiled artifacts); False where mounting is not allowed."""
    path.mkdir(parents=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True).returncode:
        return False
    return True


def _drop_read_caps() -> tuple[str, ...] | None:
    """The command prefix under which mode 000 means unreadable (None: it cannot be arranged here)."""
    if os.geteuid() != 0:
        return ()
    return DROP_READ_CAPS if shutil.which(DROP_READ_CAPS[0]) else None


def run_case(case: Case, root: Path) -> Observed:
    root.mkdir(parents=True)
    for name, content in case.files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    if case.setup is not None:
        case.setup(root)
    prefix: tuple[str, ...] = ()
    if case.unreadable or case.read_only:
        caps = _drop_read_caps()
        if caps is None:
            return Observed(returncode=0, stdout="", stderr="", before={}, after={}, skipped="root without setpriv")
        prefix = caps
        for name in case.unreadable:
            (root / name).chmod(0)
        for name in case.read_only:
            (root / name).chmod(0o555 if (root / name).is_dir() else 0o444)
    command = [*prefix, sys.executable, "-m", PROGRAMS[case.program], *case.argv]
    mounted = False
    if case.full_disk is not None:
        mounted = _mount_full_disk(root / case.full_disk)
        if not mounted:
            command = [sys.executable, "-c", _SIMULATED_FULL_DISK, str(root / case.full_disk), *case.argv]
    before = _snapshot(root)
    try:
        with open(case.stdout if case.stdout != "pipe" else os.devnull, "w") as sink:
            proc = subprocess.run(command, cwd=root, env=_env(case), text=True, timeout=120, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE if case.stdout == "pipe" else sink, stderr=subprocess.PIPE)
        after = _snapshot(root)
    finally:
        if mounted:
            subprocess.run(["umount", str(root / case.full_disk)], check=True)
        for name in case.unreadable:
            (root / name).chmod(stat.S_IRUSR | stat.S_IWUSR)
        for name in case.read_only:
            (root / name).chmod(0o755 if (root / name).is_dir() else 0o644)
    return Observed(returncode=proc.returncode, stdout=proc.stdout or "", stderr=proc.stderr,
                    before=before, after=after)


@pytest.fixture(scope="module")
def observed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Observed]:
    """The selected cases (all of them when the table is checked), a few at a time: each is a short-lived process."""
    items = [item for item in request.session.items if item.module is request.module]
    wanted = {item.callspec.params["case"].id for item in items
              if hasattr(item, "callspec") and "case" in item.callspec.params}
    if any(item.name == test_hostile_input_table_golden.__name__ for item in items):
        wanted = {case.id for case in CASES}
    root = tmp_path_factory.mktemp("hostile")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {case.id: pool.submit(run_case, case, root / case.id) for case in CASES if case.id in wanted}
        results = {name: future.result() for name, future in futures.items()}
    return {name: _normalised(result, root / name) for name, result in results.items()}


def _normalised(result: Observed, root: Path) -> Observed:
    def norm(text: str) -> str:
        for form in {str(root.resolve()), str(root)}:
            text = text.replace(form, "$TMP")
        return text

    return Observed(returncode=result.returncode, stdout=norm(result.stdout), stderr=norm(result.stderr),
                    before=result.before, after=result.after, skipped=result.skipped)


def error_line(result: Observed) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    return lines[0]


def test_enough_cases_on_every_surface() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    surfaces = {c.surface for c in CASES}
    for surface in ("JSONL data", "--param", "price YAML", "control-plane YAML", "control-plane flags", "flags",
                    "kubectl dumps", "compiled YAML, local runner", "env vars", "run-group ids", "paths", "symlinks",
                    "unreadable files", "full disk"):
        assert surface in surfaces, surface


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_exit_2_nothing_written(case: Case, observed: dict[str, Observed]) -> None:
    result = observed[case.id]
    if result.skipped:
        pytest.skip(result.skipped)
    line = error_line(result)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert line.startswith("llmpack: error: "), line
    assert case.expect in line, line
    assert CANARY not in result.stdout + result.stderr, line
    assert result.stdout.strip() == "", result.stdout
    changed = sorted(name for name in {*result.before, *result.after}
                     if result.before.get(name) != result.after.get(name))
    assert not changed, f"the command left its directory changed (half-written output?): {changed}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_table(observed: Mapping[str, Observed]) -> str:
    lines = [
        "# Hostile input: every surface, one line, exit 2",
        "",
        "Generated by `tests/llmpack/test_hostile_input.py` from what each command actually printed; regenerate with",
        "`LLMPACK_REGEN_GOLDEN=1 pytest tests/llmpack/test_hostile_input.py` (or `make golden`). "
        "Each input is built in a",
        "fresh directory (`$TMP`), the command runs there, and the row passes only when it exits 2 with exactly",
        "this one line on stderr, prints nothing on stdout, and leaves the directory exactly as it was (no run",
        "directory, report, compiled file or work directory, not even an empty one). Every row fails during",
        "validation, before any pipeline step starts. Unreadable files are mode 000 (as root, run without",
        "`CAP_DAC_OVERRIDE`); the full disk is a 64 KiB tmpfs (simulated at the write call where none can be",
        "mounted).",
        "",
        "| surface | input | message (stderr) | exit code |",
        "|---|---|---|---|",
    ]
    for case in CASES:
        result = observed[case.id]
        message = error_line(result) if not result.skipped else f"(skipped: {result.skipped})"
        lines.append(f"| {case.surface} | {_cell(case.input)} | {_cell(message)} | {result.returncode} |")
    lines += [
        "",
        "## Beyond one command line",
        "",
        "Cases one command's one line cannot show (what a step does with a planted checkpoint, what a traceback",
        "holds, what a whole run writes), each with the test that shows it.",
        "",
        "| surface | input | what happens | test |",
        "|---|---|---|---|",
    ]
    for row in ELSEWHERE:
        lines.append(f"| {row.surface} | {_cell(row.input)} | {_cell(row.behaviour)} | `{row.test}` |")
    return "\n".join(lines) + "\n"


def test_every_case_beyond_the_cli_names_a_test_that_exists() -> None:
    for row in ELSEWHERE:
        path, _, name = row.test.partition("::")
        assert (REPO / path).is_file() and f"def {name}(" in (REPO / path).read_text(encoding="utf-8"), row.test


def test_hostile_input_table_golden(observed: dict[str, Observed]) -> None:
    if any(r.skipped for r in observed.values()):
        pytest.skip("some cases cannot be arranged here; the table is kept as it is")
    fresh = render_table(observed)
    kept = TABLE.read_text(encoding="utf-8").partition(KEPT_BY_HAND)[1:] if TABLE.exists() else ("", "")
    if os.environ.get(REGEN_ENV) == "1":
        TABLE.parent.mkdir(exist_ok=True)
        TABLE.write_text(fresh + "".join(kept), encoding="utf-8")
    assert TABLE.exists(), f"{TABLE} is missing; run with {REGEN_ENV}=1 to create it"
    assert TABLE.read_text(encoding="utf-8").partition(KEPT_BY_HAND)[0] == fresh, (
        f"{TABLE.relative_to(REPO)} is stale; regenerate it with {REGEN_ENV}=1 "
        "pytest tests/llmpack/test_hostile_input.py"
    )
