"""Training throughput of a ~1B-parameter Llama on one GPU: LoRA vs full fine-tuning, measured.

    python benchmarks/gpu_train.py [--modes lora,full] [--batch 4] [--seq 2048] [--warmup 5] [--steps 50]
                                   [--compile] [--liger auto|on|off] [--grad-ckpt] [--json OUT] [--tiny]

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

MODES = ("lora", "full")

ONE_B: dict[str, Any] = {  # TinyLlama-1.1B's shape
    "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
TINY: dict[str, Any] = {
    "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
# (batch, seq, warmup, steps) when not given on the command line
DEFAULTS = {"full": (4, 2048, 5, 50), "tiny": (4, 64, 1, 3)}
MIN_TIMED_STEPS = 3


def refuse(message: str) -> NoReturn:
    print(f"gpu_train: {message}", file=sys.stderr)
    raise SystemExit(2)


def resolve_liger(choice: str, cuda: bool) -> tuple[bool, str]:
    """Apply Liger's Llama kernels (class-level patches, before any model is built) or say why not."""
    if choice == "off":
        return False, "off"
    if not cuda:
        if choice == "on":
            refuse("--liger on needs a CUDA GPU (Liger's kernels are Triton kernels)")
        return False, "off (CPU)"
    if importlib.util.find_spec("liger_kernel") is None:
        if choice == "on":
            refuse("--liger on: the liger_kernel package is not installed (pip install liger-kernel)")
        return False, "off (liger_kernel not installed)"
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()
    except Exception as exc:  # a liger release that does not fit this transformers: say so, run without
        if choice == "on":
            refuse(f"--liger on: applying Liger's Llama kernels failed: {type(exc).__name__}: {exc}")
        return False, f"off (failed: {type(exc).__name__})"
    return True, "on"


def build_model(cfg: dict[str, Any], dtype: Any, device: Any) -> Any:
    """A randomly initialised LlamaForCausalLM with SDPA attention, built directly on ``device`` in ``dtype``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**cfg, attn_implementation="sdpa", use_cache=False)
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # weights made in dtype (RoPE's inv_freq stays fp32: it is built with .float())
    try:
        with torch.device(device):
            return LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)


def enable_checkpointing(model: Any) -> None:
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5
    if enable is not None:
        enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def run_mode(mode: str, cfg: dict[str, Any], args: argparse.Namespace, device: Any, deadline: float) -> dict[str, Any]:
    import torch

    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    weights = torch.bfloat16 if cuda and mode == "lora" else torch.float32
    model = build_model(cfg, weights, device)
    if args.grad_ckpt:
        enable_checkpointing(model)
    total = sum(p.numel() for p in model.parameters())
    matmul = total - model.get_input_embeddings().weight.numel()
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        from components.training.modeling import (
            lora_target_modules,  # every linear layer but the head, as finetune does
        )

        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                                                 target_modules=lora_target_modules(model), task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in params)
    flops_per_token = 6 * matmul if mode == "full" else 4 * matmul + 6 * trainable
    opt = torch.optim.AdamW(params, lr=args.lr, fused=cuda)
    forward = torch.compile(model) if args.compile else model
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    batches = [torch.randint(0, cfg["vocab_size"], (args.batch, args.seq), generator=gen).to(device) for _ in range(4)]

    def step(i: int) -> Any:
        ids = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(args.warmup):
        step(i)
    sync()
    warmup_s = time.perf_counter() - t0
    marks: list[Any] = []
    loss = None
    t0 = time.perf_counter()
    for i in range(args.steps):
        if i >= MIN_TIMED_STEPS and time.perf_counter() > deadline:
            break
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        else:
            marks.append(time.perf_counter())
        loss = step(args.warmup + i)
    if cuda:
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()
    sync()
    timed_s = time.perf_counter() - t0
    if not cuda:
        marks.append(time.perf_counter())
    n = len(marks) - 1
    per_step = ([a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:], strict=False)] if cuda
                else [b - a for a, b in zip(marks, marks[1:], strict=False)])
    tokens_per_s = n * args.batch * args.seq / timed_s
    peak = None
    if cuda:
        from components.record.cost import peak_flops

        peak = peak_flops(torch.cuda.get_device_name())
    out = {
        "weights_dtype": str(weights).removeprefix("torch."),
        "total_params": total, "trainable_params": trainable, "matmul_params": matmul,
        "flops_per_token": flops_per_token, "warmup_steps": args.warmup, "warmup_s": warmup_s,
        "timed_steps": n, "timed_s": timed_s, "step_s": timed_s / n, "step_s_p50": statistics.median(per_step),
        "tokens_per_step": args.batch * args.seq, "tokens_per_s": tokens_per_s,
        "model_tflops": flops_per_token * tokens_per_s / 1e12,
        "mfu": flops_per_token * tokens_per_s / peak if peak else None,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "final_loss": float(loss) if loss is not None else None,
    }
    return out  # the model, optimizer and data go with this frame; main() then frees their memory


def approx_params(cfg: dict[str, Any]) -> int:
    h, kv = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * cfg["intermediate_size"]  # q, o; k, v; gate, up, down
    return 2 * cfg["vocab_size"] * h + cfg["num_hidden_layers"] * per_layer  # untied embedding and lm_head


def fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| mode | trainable | of total | tokens/s | step ms (mean) | step ms (p50) | peak mem GiB "
             "| model TFLOP/s | MFU | loss |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in results.items():
        if "error" in r:
            lines.append(f"| {mode} | {r['error']} |" + " |" * 8)
            continue
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "n/a"
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "n/a"
        share = r["trainable_params"] / r["total_params"] * 100
        lines.append(f"| {mode} | {fmt_params(r['trainable_params'])} | {share:.2f}% | {r['tokens_per_s']:,.0f} "
                     f"| {r['step_s'] * 1e3:.1f} | {r['step_s_p50'] * 1e3:.1f} | {mem} "
                     f"| {r['model_tflops']:.3g} | {mfu} | {r['final_loss']:.3f} |")
    return lines


def main() -> int:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: lora, full")
    parser.add_argument("--batch", type=int, help="sequences per step (default 4; --tiny 4)")
    parser.add_argument("--seq", type=int, help="tokens per sequence (default 2048; --tiny 64)")
    parser.add_argument("--warmup", type=int, help="uncounted steps per mode (default 5; --tiny 1)")
    parser.add_argument("--steps", type=int, help="timed steps per mode (default 50; --tiny 3)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model (compile time is in the warm-up)")
    parser.add_argument("--liger", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--grad-ckpt", action="store_true", help="activation (gradient) checkpointing")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="stop timed steps once this much wall time is spent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny config, a few fp32 steps")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        refuse(f"--modes {args.modes!r}: use lora, full or both (comma-separated)")
    batch, seq, warmup, steps = DEFAULTS["tiny" if args.tiny else "full"]
    args.batch, args.seq = args.batch or batch, args.seq or seq
    args.warmup = warmup if args.warmup is None else args.warmup
    args.steps = steps if args.steps is None else args.steps
    if min(args.batch, args.seq, args.steps) <= 0 or args.warmup < 0:
        refuse("--batch, --seq and --steps must be > 0 and --warmup >= 0")
    cfg = dict(TINY if args.tiny else ONE_B)
    if args.seq > cfg["max_position_embeddings"]:
        cfg["max_position_embeddings"] = args.seq

    warnings.filterwarnings("ignore", message=r".*deprecated and will be removed in v6", category=FutureWarning)
    import torch

    cuda = not args.tiny
    if cuda and not torch.cuda.is_available():
        refuse("no CUDA GPU here (torch.cuda.is_available() is False); the benchmark needs one, "
               "or run --tiny for the CPU smoke test")
    device = torch.device("cuda" if cuda else "cpu")
    use_liger, liger_note = resolve_liger(args.liger, cuda)
    name = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    recipe = "bf16 autocast, SDPA, fused AdamW" if cuda else "fp32, SDPA, AdamW"
    print(f"gpu_train · {name} · llama ~{fmt_params(approx_params(cfg))} (hidden {cfg['hidden_size']}, "
          f"{cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} kv, "
          f"ffn {cfg['intermediate_size']}, vocab {cfg['vocab_size']})", flush=True)
    print(f"batch {args.batch} × seq {args.seq} = {args.batch * args.seq} tokens/step · {args.warmup} warm-up + "
          f"{args.steps} timed steps per mode · {recipe} · liger {liger_note} · "
          f"compile {'on' if args.compile else 'off'} · "
          f"grad ckpt {'on' if args.grad_ckpt else 'off'}", flush=True)

    results: dict[str, dict[str, Any]] = {}
    failed = False
    for k, mode in enumerate(modes):
        deadline = started + args.budget_s * (k + 1) / len(modes)
        try:
            results[mode] = run_mode(mode, cfg, args, device, deadline)
        except torch.cuda.OutOfMemoryError:
            failed = True
            results[mode] = {"error": f"out of GPU memory at batch {args.batch} × seq {args.seq}; "
                                      "try a smaller --batch or --grad-ckpt"}
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        if args.compile:
            torch._dynamo.reset()
        if "error" in results[mode]:
            print(f"  {mode}: {results[mode]['error']}", file=sys.stderr, flush=True)
        else:
            r = results[mode]
            print(f"  {mode}: {r['timed_steps']} steps, {r['tokens_per_s']:,.0f} tokens/s "
                  f"(warm-up {r['warmup_s']:.1f} s)", file=sys.stderr, flush=True)
    wall_s = time.perf_counter() - started
    print()
    print("\n".join(table(results)))
    print()
    peak = None
    if cuda:
        from components.record.cost import peak_flops

        peak = peak_flops(name)
    peak_note = (f"peak {peak / 1e12:.0f} TFLOP/s dense bf16 (components.record.cost)" if peak
                 else "MFU n/a: " + ("CPU run" if not cuda else f"no peak FLOPs known for {name!r}"))
    print(f"MFU = FLOPs/token × tokens/s / peak; {peak_note}. FLOPs/token: full 6N, LoRA 4N + 6N_lora; "
          f"N = matmul weights (input embedding excluded); attention scores and recompute not counted.")
    short = [m for m, r in results.items() if "error" not in r and r["timed_steps"] < args.steps]
    if short:
        print(f"note: {', '.join(short)} stopped early at the --budget-s {args.budget_s:.0f} s time budget")
    print(f"wall time {wall_s:.1f} s (imports, model builds, warm-up and timed steps)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": name, "config": cfg, "peak_flops": peak,
            "settings": {"batch": args.batch, "seq": args.seq, "warmup": args.warmup, "steps": args.steps,
                         "lr": args.lr, "lora_r": args.lora_r, "compile": args.compile, "liger": use_liger,
                         "liger_note": liger_note, "grad_ckpt": args.grad_ckpt, "tiny": args.tiny,
                         "budget_s": args.budget_s, "autocast": "bf16" if cuda else None, "fused_adamw": cuda},
            "modes": results, "wall_s": wall_s,
        }, indent=2, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
