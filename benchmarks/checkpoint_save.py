"""How long a finetune checkpoint write takes for a given training state, and the grace period it needs.

    python benchmarks/checkpoint_save.py [--mb 64,256] [--rounds 3] [--dir DIR]

``llmpack compile --checkpoint-pvc`` sizes each GPU pod's ``terminationGracePeriodSeconds`` from a
checkpoint write time (``components.podspec.grace_for``: 2 x write + 30 s); the finetune step measures
its own (the metric ``checkpoint_save_s``) and ``--checkpoint-save-s`` feeds it back. This measures
:func:`components.training.checkpointing.save_checkpoint` itself (state gathered, safetensors + JSON,
fsync, manifest with every file's sha256, rename, prune) for trainable weights of about MB megabytes
in fp32 with AdamW's two moments (so the state files are about 3 x MB), written to ``--dir`` (point it at
the volume you mean to use: a network disk is the case that matters). It prints, per size, the median
and worst write of ``--rounds`` and the grace period each would compile to. A 7-8B model's LoRA
(r=16, every linear layer) is about 160 MB of fp32 weights; full fine-tuning of it, tens of GB.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def state_of(mb: int) -> tuple[object, object]:
    """A model of ``mb`` MB of fp32 trainable weights and an AdamW that took one step (moments filled)."""
    import torch

    n = max(1, mb * (1 << 20) // 4 // 4096)
    net = torch.nn.Linear(4096, n, bias=False)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.ones(1, 4096)).sum().backward()
    opt.step()
    return net, opt


def main(argv: list[str] | None = None) -> int:
    from components.podspec import grace_for
    from components.training.checkpoint_state import STATE_FILES
    from components.training.checkpointing import save_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="64,256", help="comma-separated sizes of the trainable weights, MB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"{'weights':>8} {'state file':>11} {'median':>8} {'worst':>8} {'MB/s':>7} {'grace (s)':>10}")
        for mb in (int(x) for x in args.mb.split(",")):
            net, opt = state_of(mb)
            times = []
            for r in range(args.rounds):
                began = time.perf_counter()
                final = save_checkpoint(Path(tmp) / f"{mb}", r + 1, net, opt, "bench")
                times.append(time.perf_counter() - began)
            size = sum((final / name).stat().st_size for name in STATE_FILES) / (1 << 20)
            med, worst = statistics.median(times), max(times)
            print(f"{mb:>6}MB {size:>9.0f}MB {med:>7.2f}s {worst:>7.2f}s {size / med:>7.0f} {grace_for(worst):>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
