"""What skipping the NaN fill of new tensors saves a CPU training step (components.modeling.deterministic_cpu).

    python benchmarks/train_step.py [--rounds 3] [--steps 40]

Each round starts fresh interpreters, alternating the settings: deterministic kernels with
PyTorch's ``fill_uninitialized_memory`` on (what ``use_deterministic_algorithms(True)`` turns
on, and what finetune ran before), and deterministic kernels with it off (what
:func:`components.modeling.deterministic_cpu` sets now). Each interpreter trains the tiny model's
LoRA adapter as finetune does (batch 8 x 128 tokens, AdamW) for ``--steps`` steps after five
uncounted ones. Printed: median milliseconds per step per setting, the saving, and whether the
trained weights were equal byte for byte (exit 1 when they were not).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = """
import hashlib, time, torch
from components.modeling import deterministic_cpu, lora_target_modules
from components.tiny import build_tiny_model
from peft import LoraConfig, get_peft_model
deterministic_cpu()
torch.utils.deterministic.fill_uninitialized_memory = {fill}
torch.manual_seed(0)
net = build_tiny_model()
net = get_peft_model(net, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=lora_target_modules(net)))
net.train()
opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.95))
x = torch.randint(0, 256, (8, 128))
for i in range(5 + {steps}):
    if i == 5:
        t0 = time.perf_counter()
    loss = net(input_ids=x, labels=x).loss
    loss.backward()
    loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
ms = (time.perf_counter() - t0) / {steps} * 1000
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters() if p.requires_grad)).hexdigest()
print(ms, digest, flush=True)
"""


def one(fill: bool, steps: int) -> tuple[float, str]:
    """(ms per step, sha256 of the trained adapter weights) of one fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", CODE.format(fill=fill, steps=steps)], capture_output=True, text=True,
                          check=True)
    ms, digest = proc.stdout.split()
    return float(ms), digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    rows: dict[bool, list[float]] = {True: [], False: []}
    digests: set[str] = set()
    for i in range(args.rounds):
        for fill in ((True, False) if i % 2 == 0 else (False, True)):
            ms, digest = one(fill, args.steps)
            rows[fill].append(ms)
            digests.add(digest)
    med = {fill: statistics.median(rows[fill]) for fill in rows}
    print(f"{'deterministic CPU kernels':<34}{'ms/step':>9}")
    print(f"{'  new tensors NaN-filled (before)':<34}{med[True]:>9.1f}")
    print(f"{'  not filled (deterministic_cpu)':<34}{med[False]:>9.1f}")
    print(f"{'saved':<34}{med[True] - med[False]:>9.1f}  ({(med[True] - med[False]) / med[True]:.0%})")
    same = len(digests) == 1
    print(f"trained weights identical: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
