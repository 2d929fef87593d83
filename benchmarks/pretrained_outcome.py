"""Does a real pretrained model learn the built-in tasks, on prompts it never saw? Base -> tuned, over seeds.

    python benchmarks/pretrained_outcome.py [--model smollm2-135m] [--steps 120] [--seeds 0,1,2]
        [--eval-rows 60] [--lr 3e-3] [--batch-size 8] [--seq-len 128] [--jobs 1] [--json-out FILE]

The pipeline's own pieces in one process, as benchmarks/tiny_task_learning.py does, for each seed:
prepare_data's built-in split (the seed makes the vocabulary and splits it: eval prompts only of
held-out words and numbers), tokenize's chat-template pairs and packing, finetune's model (LoRA on
every linear layer but the head), schedule and batch order, and evaluate's greedy answers and
exact match, on the first ``--eval-rows`` unseen prompts (the three tasks in turn). It prints base
-> tuned exact match per task and overall for each seed, then the mean and 95% interval over the
seeds (components.serving.spread). ``--jobs J`` runs J seeds at once, one torch thread each (the
same work; on a shared CPU, one thread per process wastes less). Figures: docs/serving.md.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def one_seed(a: argparse.Namespace, seed: int) -> dict[str, Any]:
    import torch

    from components.steps.tokenize import load_tokenizer

    if a.jobs > 1:
        torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tok = load_tokenizer(a.model)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)  # as tokenize chooses
    from components.steps.finetune import batch_indices, build_model, lr_at
    from components.steps.tokenize import pack, pair_ids
    from components.training.data import builtin_split, builtin_task
    from components.training.generation import greedy_answers, score, task_rows

    train, held_out = builtin_split(a.rows, seed, 0.1)  # as prepare_data makes it at this seed
    blocks, labels = pack([pair_ids(tok, r) for r in train], a.seq_len, pad_id, keep_tail=False)
    x, y = torch.tensor(blocks), torch.tensor(labels)
    evaluation = held_out[: a.eval_rows]
    rows, _ = task_rows([pair_ids(tok, r) for r in evaluation], evaluation, max_prompt_tokens=a.seq_len,
                        task_of=builtin_task)
    eos = tok.eos_token_id if tok.eos_token_id is not None else pad_id

    torch.manual_seed(seed)  # as finetune seeds before building (LoRA's A matrices)
    net, _ = build_model(a.model, "lora", lora_r=a.lora_r, lora_alpha=2 * a.lora_r)
    optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0,
                                  betas=(0.9, 0.95))

    def exact(model: Any) -> dict[str, Any]:
        got = greedy_answers(model, rows, tokenizer=tok, eos_id=eos, pad_id=pad_id, device=torch.device("cpu"),
                             amp_dtype=None)
        s = score(got, rows)
        net.train()
        return {"exact_match": s.exact_match, "per_task": s.per_task, "examples": list(zip(
            [r["response"] for r in rows[:3]], got[:3], strict=True))}

    began = time.perf_counter()
    with net.disable_adapter():
        base = exact(net)
    base_s = time.perf_counter() - began
    print(f"  seed {seed} base exact match {100 * base['exact_match']:.1f}% ({base_s:.0f}s)", flush=True)
    net.train()
    began = time.perf_counter()
    for step in range(a.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, lr=a.lr, warmup=6, total=a.steps)
        idx = batch_indices(step, a.batch_size, len(x), seed)
        loss = net(input_ids=x[idx], labels=y[idx]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == a.steps - 1:
            print(f"  seed {seed} step {step} loss {loss.item():.3f} ({time.perf_counter() - began:.0f}s)", flush=True)
    train_s = time.perf_counter() - began
    tuned = exact(net)
    return {"seed": seed, "rows": len(rows), "train_blocks": len(x), "base": base, "tuned": tuned,
            "train_s": train_s, "base_eval_s": base_s}


def line(r: dict[str, Any]) -> str:
    def pct(v: float) -> str:
        return f"{100 * v:.1f}%"

    tasks = ", ".join(f"{t} {pct(r['base']['per_task'].get(t, 0.0))} -> {pct(v)}"
                      for t, v in r["tuned"]["per_task"].items())
    return (f"seed {r['seed']}: exact match on {r['rows']} unseen prompts base {pct(r['base']['exact_match'])} -> "
            f"tuned {pct(r['tuned']['exact_match'])} ({tasks}); train {r['train_s']:.0f}s")


def summary(results: list[dict[str, Any]]) -> list[str]:
    from components.serving.spread import interval

    out = []
    figures = {"overall": (lambda r, side: r[side]["exact_match"])}
    for task in results[0]["tuned"]["per_task"]:
        figures[task] = lambda r, side, t=task: r[side]["per_task"].get(t, 0.0)
    for name, get in figures.items():
        base = interval([get(r, "base") for r in results])
        tuned = interval([get(r, "tuned") for r in results])
        gain = interval([get(r, "tuned") - get(r, "base") for r in results])
        out.append(f"{name}: base {base.text(100, '%')} -> tuned {tuned.text(100, '%')}; "
                   f"improvement {gain.text(100, ' points')}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seeds", default="0,1,2", help="comma list")
    ap.add_argument("--eval-rows", type=int, default=60, help="unseen prompts scored per seed (the first of the split)")
    ap.add_argument("--rows", type=int, default=2000, help="built-in rows (prepare_data's builtin_size)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--json-out", default="", help="write every figure here as JSON")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at once (processes)")
    a = ap.parse_args()

    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    if a.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(one_seed, [a] * len(seeds), seeds))
    else:
        results = []
        for seed in seeds:  # each seed's line as soon as it is measured (a seed is tens of minutes on a CPU)
            results.append(one_seed(a, seed))
            print(line(results[-1]), flush=True)
    for r in results:
        if a.jobs > 1:
            print(line(r), flush=True)
        print(f"  e.g. expected -> answered: {r['tuned']['examples']}", flush=True)
    for text in summary(results):
        print(text)
    print({k: v for k, v in vars(a).items() if k != "json_out"})
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(a), "results": results}, fh, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
