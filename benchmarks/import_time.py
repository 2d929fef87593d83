"""How long `import components` takes, and that it pulls in no heavy library.

    python benchmarks/import_time.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys

CODE = (
    "import sys, time; t = time.perf_counter(); import components, components.finetune_pipeline; "
    "print(time.perf_counter() - t); "
    "print(','.join(m for m in ('torch','transformers','peft','mlflow','kfp','hera','kubernetes') if m in sys.modules))"
)


def main() -> None:
    times, heavy = [], ""
    for _ in range(10):
        out = subprocess.run([sys.executable, "-X", "frozen_modules=on", "-c", CODE], capture_output=True, text=True,
                             check=True)
        t, heavy = out.stdout.splitlines()[0], (out.stdout.splitlines() + [""])[1]
        times.append(float(t))
    print(f"import components: median {statistics.median(times) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms over 10 fresh interpreters")
    print(f"heavy modules imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
