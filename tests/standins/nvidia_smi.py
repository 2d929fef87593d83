"""A stand-in ``nvidia-smi``: a tiny executable speaking the real tool's CSV for the query llmpack makes.

``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits``
prints one line per GPU, e.g. ``0, 87, 30512, 81559`` (MiB). Any other command line exits 2, so a
test fails if llmpack asks differently. The GPUs read busy (``busy`` %) once ``busy_marker`` exists,
idle (0 %) before: a test's step touches the file when its "kernels" start. ``broken=True`` is the
tool on a node without a working driver: it prints NVIDIA's message and exits 9.
"""

from __future__ import annotations

import shlex
from pathlib import Path

QUERY = ("--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits")
BROKEN_MESSAGE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                  "Make sure that the latest NVIDIA driver is installed and running.")


def install(directory: Path, *, busy_marker: Path | None = None, gpus: int = 1, busy: int = 87,
            broken: bool = False) -> Path:
    """Write ``directory/nvidia-smi`` (put ``directory`` first on PATH) and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "nvidia-smi"
    if broken:
        body = f"echo {shlex.quote(BROKEN_MESSAGE)}\nexit 9\n"
    else:
        idle = "".join(f'echo "{i}, 0, 301, 81559"\n' for i in range(gpus))
        hot = "".join(f'echo "{i}, {busy}, 30512, 81559"\n' for i in range(gpus))
        marker = shlex.quote(str(busy_marker or directory / "busy"))
        body = (f'[ "$1" = "{QUERY[0]}" ] && [ "$2" = "{QUERY[1]}" ] && [ "$#" = 2 ] || exit 2\n'
                f"if [ -e {marker} ]; then\n{hot}else\n{idle}fi\n")
    exe.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    exe.chmod(0o755)
    return exe
