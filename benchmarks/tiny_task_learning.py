"""Does the tiny base learn the built-in tasks in a run's steps? Exact match of greedy answers, per task.

    python benchmarks/tiny_task_learning.py [--layers 2] [--save embed_tokens,lm_head] [--steps 120]
        [--lr 3e-3] [--seed 0] [--eval-at 60,90]

The finetune step's own pieces (built-in data and split, packing, schedule, batch order, LoRA on
every linear layer) in one process, without the pipeline around them, so one variant takes
seconds: ``--layers`` sets the tiny model's depth, ``--save`` the modules LoRA trains whole
(peft's ``modules_to_save``; empty: none), ``--method full`` trains every weight. It prints the
training loss every 20 steps, the seconds training took, and the exact match of the base and the
tuned model on the held-out split, overall and per task, as evaluate scores it
(components.training.generation). What it measured is in docs/internals/decisions.md ("Task evaluation").
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import torch

    import components.training.tiny as tiny
    from components.steps.finetune import batch_indices, lr_at
    from components.steps.tokenize import pack, pair_ids
    from components.training.data import builtin_split, builtin_task
    from components.training.generation import greedy_answers, score, task_rows
    from components.training.modeling import lora_target_modules

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", choices=("lora", "full"), default="lora")
    ap.add_argument("--layers", type=int, default=tiny.TINY_CONFIG["num_hidden_layers"])
    ap.add_argument("--save", default=",".join(tiny.TINY_MODULES_TO_SAVE), help="comma list; '' for none")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-at", default="", help="comma list of steps to score at, besides the last")
    a = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    tok = tiny.ByteTokenizer()
    train, held_out = builtin_split(2000, 0, 0.1)  # eval made only of unseen words and numbers
    blocks, labels = pack([pair_ids(tok, r) for r in train], 128, tiny.PAD_ID, keep_tail=False)
    x, y = torch.tensor(blocks), torch.tensor(labels)
    rows, _ = task_rows([pair_ids(tok, r) for r in held_out], held_out, max_prompt_tokens=128, task_of=builtin_task)

    torch.manual_seed(a.seed)  # as finetune seeds before building (LoRA's A matrices)
    tiny.TINY_CONFIG["num_hidden_layers"] = a.layers
    net = tiny.build_tiny_model()
    if a.method == "lora":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0.0,
                            target_modules=lora_target_modules(net),
                            task_type="CAUSAL_LM", modules_to_save=[m for m in a.save.split(",") if m] or None)
        net = get_peft_model(net, config)
    optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0,
                                  betas=(0.9, 0.95))

    def exact_match(model: object) -> str:
        got = greedy_answers(model, rows, tokenizer=tok, eos_id=tiny.EOS_ID, pad_id=tiny.PAD_ID,
                             device=torch.device("cpu"), amp_dtype=None)
        s = score(got, rows)
        net.train()
        return f"{100 * s.exact_match:.1f}% (" + ", ".join(f"{t} {100 * v:.1f}%" for t, v in s.per_task.items()) + ")"

    if a.method == "lora":
        with net.disable_adapter():
            print("base exact match", exact_match(net), flush=True)
    eval_at = {int(s) for s in a.eval_at.split(",") if s}
    net.train()
    began = time.perf_counter()
    for step in range(a.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, lr=a.lr, warmup=6, total=a.steps)
        idx = batch_indices(step, a.batch_size, len(x), a.seed)
        loss = net(input_ids=x[idx], labels=y[idx]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
        if step + 1 in eval_at:
            print(f"  at {step + 1}: exact match {exact_match(net)}", flush=True)
    print(f"train_s {time.perf_counter() - began:.1f}")
    print("tuned exact match", exact_match(net), vars(a))


if __name__ == "__main__":
    main()
