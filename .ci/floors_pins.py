"""Pin every direct dependency of pyproject.toml to its declared floor (a lowest-direct resolution).

Run by ``.ci/floors``: ``python .ci/floors_pins.py pyproject.toml OUTDIR`` writes OUTDIR/floors.txt
(``name[extras]==floor`` for each direct dependency, the dev extra's too, torch left out: it is
installed first, from its own index) and OUTDIR/torch-floor.txt (``torch==floor``). pip then
resolves the transitive dependencies against these pins; if the floors cannot work together
(one floor needs more than another allows), the install fails, and so does CI. A dependency
declared without a floor (``>=`` or ``==``) fails here: its floor would be whatever is oldest.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement


def floor(req: Requirement) -> str:
    """The lowest version ``req`` admits, from its ``>=``/``==``/``~=`` clause."""
    lows = [spec.version for spec in req.specifier if spec.operator in (">=", "==", "~=")]
    if len(lows) != 1:
        raise SystemExit(f"pyproject.toml: dependency {str(req)!r} has no single floor (>=, == or ~=); declare one")
    if not req.specifier.contains(lows[0], prereleases=True):
        raise SystemExit(f"pyproject.toml: dependency {str(req)!r}: its floor {lows[0]} is outside its own range")
    return lows[0]


def pins(pyproject: dict) -> dict[str, str]:
    """``{name: 'name[extras]==floor'}`` for every direct dependency and the dev extra's."""
    project = pyproject["project"]
    out: dict[str, str] = {}
    for line in [*project["dependencies"], *project.get("optional-dependencies", {}).get("dev", [])]:
        req = Requirement(line)
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out[req.name.lower()] = f"{req.name}{extras}=={floor(req)}"
    return out


def main(argv: list[str]) -> int:
    src, outdir = Path(argv[1]), Path(argv[2])
    pinned = pins(tomllib.loads(src.read_text()))
    torch = pinned.pop("torch", None)
    if torch is None:
        raise SystemExit(f"{src}: no torch dependency")
    (outdir / "floors.txt").write_text("".join(f"{p}\n" for p in pinned.values()))
    (outdir / "torch-floor.txt").write_text(torch + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
