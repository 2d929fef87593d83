"""What pausing the collector's full passes saves a step process (components.process.startup), measured.

    python benchmarks/gc_startup.py [--rounds 5]

Each round starts fresh interpreters, alternating the two settings: one as a step process ran
before (the collector as configured by default), one as ``components.runtime`` runs it now
(:func:`components.process.startup.pause_full_collections` at start, :func:`~components.process.startup.settle`
once the model is built). Each interpreter imports torch, transformers and peft and builds the
tiny model with its LoRA adapter (what finetune and evaluate do before ``model_loaded``), then
exits. Printed: medians of the start-up (interpreter start to model built) and of the exit
(the last line of Python to the process gone), per setting, and the saving.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CODE = """
import sys, time
if {paused}:
    from components.process import startup
    startup.pause_full_collections()
from components.training.modeling import load_base_model, lora_target_modules
from components.record.telemetry import process_start_time
from peft import LoraConfig, get_peft_model
net = load_base_model("tiny")
net = get_peft_model(net, LoraConfig(r=8, target_modules=lora_target_modules(net)))
if {paused}:
    startup.settle()
print(time.time() - process_start_time(), time.time(), flush=True)
"""


def one(paused: bool) -> tuple[float, float]:
    """(start-up s, exit s) of one fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", CODE.format(paused=paused)], capture_output=True, text=True,
                          check=True)
    gone = time.time()
    startup_s, last_line = (float(x) for x in proc.stdout.split())
    return startup_s, gone - last_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    one(False)  # warm the page cache, not counted
    rows: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(args.rounds):
        for paused in ((False, True) if i % 2 == 0 else (True, False)):
            rows[paused].append(one(paused))
    med = {p: (statistics.median(r[0] for r in rows[p]), statistics.median(r[1] for r in rows[p])) for p in rows}
    print(f"{'collector':<28}{'start-up s':>12}{'exit s':>10}")
    for paused, label in ((False, "default thresholds"), (True, "full passes paused (now)")):
        print(f"{label:<28}{med[paused][0]:>12.2f}{med[paused][1]:>10.2f}")
    saved = (med[False][0] - med[True][0], med[False][1] - med[True][1])
    print(f"{'saved per step process':<28}{saved[0]:>12.2f}{saved[1]:>10.2f}")
    print(f"medians of {args.rounds} fresh interpreters per setting, alternating; "
          "torch, transformers, peft + tiny model")


if __name__ == "__main__":
    main()
