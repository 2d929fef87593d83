"""finetune: LoRA (peft) or full fine-tuning of a causal LM on packed sequences.

Read it top to bottom, as a torchtune recipe: check the arguments, set up the device, the data,
the model and the optimizer, resume from the newest checkpoint if one exists, then the loop, then
the outputs. Checkpoints (trainable weights, optimizer, scheduler, RNG states, data position)
are written atomically every ``checkpoint_every`` steps (or every ``LLMPACK_CHECKPOINT_MINUTES``,
whichever comes first) and when SIGTERM arrives, so a preempted GPU node loses at most one
interval; how they are written and trusted is :mod:`components.training.checkpointing`'s job, not
the recipe's. On a cluster they go to the checkpoint volume under this run's own directory
(:func:`checkpoint_root`), where the retry pod finds them; each write's seconds are measured and the
longest is the metric ``checkpoint_save_s``, logged beside the pod's ``grace_period_s``.

While it trains, ``llmpack-progress.json`` beside the step's events says how far it is (step k of
N, tokens/s, ETA; :mod:`components.training.progress`), so ``llmpack`` shows the same live
progress whichever orchestrator ran it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from components import bounded, reporting, settings
from components.dsl import GPU_TOLERATION, Dataset, Execution, Input, Model, Output, Resources, Retry, step
from components.errors import InputError
from components.reporting import emit_step, metric, submitted_at
from components.serving.sealed import MODEL, TOKENS, private_copy, seal_id, sealed_output, verified_seal
from components.training.checkpointing import (
    real_run_dir,
    remove_scratch,
    resume_newest,
    run_checkpoint_dir,
    run_fingerprint,
    save_checkpoint,
    train_state,
)
from components.training.modeling import (
    MODEL_META,
    device_and_dtype,
    keep_tuned,
    load_base_model,
    lora_target_modules,
    peft_wrapping,
)
from components.training.progress import PROGRESS_FILE, ProgressFile
from components.training.tiny import TINY, TINY_MODULES_TO_SAVE
from components.training.trainer_status import TrainerStatus


def lr_at(step: int, *, lr: float, warmup: int, total: int) -> float:
    """Linear warmup to ``lr``, then cosine decay to 10% of it."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def batch_indices(position: int, batch_size: int, n: int, seed: int) -> list[int]:
    """Which blocks micro-batch number ``position`` takes: a fresh seeded permutation per epoch."""
    import numpy as np

    per_epoch = max(1, n // batch_size)
    epoch, offset = divmod(position, per_epoch)
    order = np.random.default_rng(seed + epoch).permutation(n)
    return order[offset * batch_size : (offset + 1) * batch_size].tolist()


def checkpoint_root(checkpoint_dir: str, out: Path) -> tuple[Path, bool]:
    """``(where checkpoints go, whether they are scratch once the weights are saved)``.

    ``checkpoint_dir`` when given (kept); else, with a checkpoint volume (``LLMPACK_CHECKPOINT_ROOT``),
    this run's directory on it (:func:`~components.training.checkpointing.run_checkpoint_dir`: the
    pipeline run, never the attempt; made, or checked, a real directory: a symlink is one line, exit 2);
    else ``<output>/checkpoints``, which dies with the pod.
    """
    if checkpoint_dir:
        return Path(checkpoint_dir), False
    root = settings.CHECKPOINT_ROOT.get()
    if not root:
        return out / "checkpoints", True
    tel = reporting.current()
    path = run_checkpoint_dir(Path(root), tel.ctx.pipeline_run if tel else "", tel.step if tel else "finetune")
    return real_run_dir(Path(root), path), True


def checkpoint_owner() -> dict[str, str]:
    """The pipeline run and step this step's checkpoints belong to, as their manifests name them."""
    tel = reporting.current()
    return {"pipeline_run": tel.ctx.pipeline_run if tel else "", "step": tel.step if tel else "finetune"}


def checkpoint_minutes() -> float:
    """``LLMPACK_CHECKPOINT_MINUTES`` (0: by steps only); a bad value is one line naming it."""
    try:
        minutes = settings.CHECKPOINT_MINUTES.get() or 0.0
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if minutes < 0:
        raise InputError(f"{settings.CHECKPOINT_MINUTES.name}={minutes:g}: must be >= 0")
    return minutes


def log_checkpoint_timing(save_s: float) -> None:
    """The longest checkpoint write, against the grace period the pod was compiled with (when known)."""
    if save_s > 0:
        metric("checkpoint_save_s", save_s)
    grace = settings.GRACE_PERIOD_S.raw()
    if grace and grace.isdigit():
        metric("grace_period_s", float(grace))


def check_arguments(*, max_steps: int, method: str, batch_size: int, grad_accum: int, strategy: str) -> None:
    """One line for an argument the step cannot train with (the pipeline's parameter gate checks them first)."""
    if max_steps <= 0:
        raise InputError(f"max_steps is {max_steps}; must be > 0")
    if method not in ("lora", "full"):
        raise InputError(f"method {method!r}: use 'lora' or 'full'")
    if batch_size <= 0 or grad_accum <= 0:
        raise InputError("batch_size and grad_accum must be > 0")
    if strategy not in ("ddp", "fsdp"):
        raise InputError(f"strategy {strategy!r}: use 'ddp' or 'fsdp'")


def build_model(base_model: str, method: str, *, lora_r: int, lora_alpha: int) -> tuple[Any, set[str]]:
    """The model to train (LoRA adapters on every linear layer but the head, or all weights) and its block class
    names."""
    net = load_base_model(base_model)
    blocks = set(getattr(net, "_no_split_modules", None) or ())  # the decoder block class names FSDP shards by
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        targets = lora_target_modules(net)  # every linear layer but the head, from the architecture
        whole = list(TINY_MODULES_TO_SAVE) if base_model == TINY else None  # the random base's head and embeddings
        config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets,
                            task_type="CAUSAL_LM", modules_to_save=whole)
        with peft_wrapping():  # peft reads transformers' deprecated is_gradient_checkpointing
            net = get_peft_model(net, config)
        net.peft_config["default"].base_model_name_or_path = base_model
        net.peft_config["default"].target_modules = targets  # peft keeps a set: its saved order follows the hash seed
    return net, blocks


def wrap_for_ranks(net: Any, blocks: set[str], world: Any, strategy: str, device: Any) -> tuple[Any, bool]:
    """(the module the loop calls, whether weights are sharded): the model itself, DDP, or FSDP2 in place."""
    if world.distributed and strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for module in list(net.modules()):
            if type(module).__name__ in blocks:
                fully_shard(module)
        fully_shard(net)  # the rest (embeddings, norm, head); the loop calls net, sharded in place
        return net, True
    if world.distributed:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None), False
    return net, False


def train_step(train_net: Any, input_ids: Any, labels: Any, *, step_no: int, grad_accum: int, batch_size: int,
               seed: int, world: Any, device: Any, amp_dtype: Any) -> tuple[float, int]:
    """Forward and backward over one optimizer step's micro-batches: (its loss, the tokens it saw on every rank)."""
    import torch

    loss_sum, tokens = 0.0, 0
    for micro in range(grad_accum):
        idx = batch_indices(step_no * grad_accum + micro, batch_size, len(input_ids), seed)
        if not world.distributed:
            x, y = input_ids[idx].to(device), labels[idx].to(device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = train_net(input_ids=x, labels=y).loss / grad_accum
        else:  # this rank's slice; sum over its tokens / the global batch's tokens, times the ranks DDP divides by
            share = len(idx) // world.size
            mine = idx[world.rank * share : (world.rank + 1) * share]
            n_items = max(1, int((labels[idx][:, 1:] != -100).sum()))  # the loss's shifted labels
            x, y = input_ids[mine].to(device), labels[mine].to(device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = train_net(input_ids=x, labels=y, num_items_in_batch=n_items).loss * world.size / grad_accum
        loss.backward()
        loss_sum += loss.item()  # waits for the GPU: the step's loss is known when this returns
        tokens += x.numel() * world.size
    return loss_sum, tokens


TRAIN_INPUTS = frozenset({"train_input_ids.npy", "train_labels.npy"})  # the tokenize step's files finetune reads


def save_outputs(out: Path, net: Any, whole: dict[str, Any] | None, *, method: str, fused_evaluate: bool,
                 meta: dict[str, Any], tokens_seal: str) -> None:
    """The tuned weights (adapter or full), the in-memory hand-over to a fused evaluate, and the model's metadata;
    the seal names the tokens seal trained on (``tokens_seal``: :func:`~components.serving.sealed.seal_id`)."""
    extra: dict[str, Any] = {"state_dict": whole} if whole is not None else {}
    if method == "lora":
        # Our LoRA targets linear layers only and never resizes the vocabulary, so no embedding
        # layer is saved as a LoRA target (``tiny``'s trained copies are saved as modules_to_save
        # all the same); peft's "auto" would ask the hub for the base model's config.json to
        # find that out (a network request for `tiny`, which is no hub id).
        extra["save_embedding_layers"] = False
    tel = reporting.current()
    weights = "adapter" if method == "lora" else "full"
    # written in this process's own directory, copied out hashing what is written, signed: evaluate and register
    # take exactly these bytes (components.serving.sealed)
    with sealed_output(out, MODEL, tel.ctx.pipeline_run if tel is not None else "", weights=weights,
                       meta=MODEL_META, tokens_seal=tokens_seal) as private:
        net.save_pretrained(private / weights, safe_serialization=True, **extra)
        (private / MODEL_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if fused_evaluate:
        keep_tuned(out, net)  # for evaluate, when it runs fused in this process


@step(
    execution=Execution(
        resources=Resources(cpu=8, memory="64Gi", gpu_type="nvidia-h100-80gb", gpus=1),
        retry=Retry(limit=2, backoff_s=30, factor=2, max_backoff_s=300),
        timeout_s=6 * 3600,
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=(GPU_TOLERATION,),
        hf_cache=True,
    )
)
def finetune(
    tokens: Input[Dataset],
    model: Output[Model],
    base_model: str = "tiny",
    method: str = "lora",
    max_steps: int = 120,
    batch_size: int = 8,
    grad_accum: int = 1,
    lr: float = 3e-3,
    warmup_steps: int = 6,
    weight_decay: float = 0.0,
    lora_r: int = 16,
    lora_alpha: int = 32,
    seed: int = 0,
    checkpoint_every: int = 0,
    checkpoint_dir: str = "",
    nproc_per_node: int = 1,
    strategy: str = "ddp",
    nnodes: int = 1,
    trainjob: str = "",
) -> None:
    """Fine-tune with LoRA (default) or fully; AdamW, warmup + cosine, resumable; DDP on many processes.

    With ``nproc_per_node`` P > 1 the step runs on P ranks (components.training.distributed launches them):
    every rank takes its slice of the same global batch of ``batch_size`` blocks, the loss is
    normalised by the global batch's token count so the gradient DDP averages is the one a single
    process computes, and rank 0 writes the outputs and checkpoints. ``strategy="fsdp"`` shards
    weights, gradients and optimizer state over the ranks (FSDP2 ``fully_shard`` per decoder
    block) for models whose training state does not fit one GPU; checkpoints and outputs are
    gathered whole on rank 0. ``nnodes`` N > 1 runs it as a Kubeflow Trainer TrainJob of N nodes
    described by ``trainjob`` (components.trainjob.gang; the ranks see only the world torchrun gives them).
    """
    import numpy as np
    import torch

    from components.training import distributed

    check_arguments(max_steps=max_steps, method=method, batch_size=batch_size, grad_accum=grad_accum, strategy=strategy)
    world = distributed.world_from_env() if distributed.is_rank() else distributed.World()
    if world.distributed and batch_size % world.size:
        raise InputError(f"batch_size {batch_size} does not split over {world.size} processes; "
                         f"use a multiple of {world.size}")
    chaos_pause_s = float(os.environ.get(settings.CHAOS_CHECKPOINT_PAUSE_S.name) or 0)  # a test hook, 0 in real runs
    every_s = checkpoint_minutes() * 60.0

    # ---- determinism and device
    torch.manual_seed(seed)
    np.random.seed(seed)
    device, amp_dtype = device_and_dtype()
    if world.distributed:
        device = distributed.init(world)  # this rank's GPU (NCCL), or the CPU (Gloo)
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)

    # ---- data: packed blocks, prompt tokens already masked (-100)
    # the train split tokenize sealed, read once from a private copy (components.serving.sealed)
    tel = reporting.current()
    tokens_seal = verified_seal(Path(tokens.path), tel.ctx.pipeline_run if tel is not None else "", TOKENS)
    train = {name: want for name, want in tokens_seal["files"].items() if name in TRAIN_INPUTS}
    with tempfile.TemporaryDirectory(prefix="llmpack-finetune-") as private:
        src = private_copy(Path(tokens.path), train, Path(private) / "tokens")
        input_ids = torch.from_numpy(np.load(src / "train_input_ids.npy"))
        labels = torch.from_numpy(np.load(src / "train_labels.npy"))
    seq_len = input_ids.shape[1]

    # ---- model and optimizer
    net, blocks = build_model(base_model, method, lora_r=lora_r, lora_alpha=lora_alpha)
    net.to(device)
    net.train()
    distributed.gather_time(world, "model_loaded")
    train_net, sharded = wrap_for_ranks(net, blocks, world, strategy, device)
    n_params = sum(p.numel() for p in net.parameters())
    trainable = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))

    # ---- resume: the newest checkpoint signed with the user's key, of these very settings and data,
    # whose files all match its manifest (a shared checkpoint_dir must not hand one run's state to
    # another; an unsigned or forged one, even of the final step, is refused and never skips training)
    try:
        ckpt_root, scratch = checkpoint_root(checkpoint_dir, Path(model.path))
        ckpt_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there, a name too long, a read-only place: one line, exit 2
        raise InputError(f"checkpoints: {exc.filename or checkpoint_dir} cannot be made a directory "
                         f"({exc.strerror})") from None
    bounded.pin_directory(ckpt_root)  # saved to and pruned in only while it is this directory (never a link since)
    fingerprint = run_fingerprint([base_model, method, max_steps, batch_size, grad_accum, lr, warmup_steps,
                                   weight_decay, lora_r, lora_alpha, seed]
                                  + ([world.size, strategy] if world.distributed else []),
                                  input_ids.numpy().tobytes() + labels.numpy().tobytes(),  # round 32: the mask
                                  shape=tuple(input_ids.shape))
    # An explicit checkpoint_dir may be resumed by a rerun of the same settings; on the volume, only by this run.
    owner = checkpoint_owner()
    start_step = 0
    resumed = resume_newest(ckpt_root, fingerprint, net, optimizer, sharded=sharded,
                            owner=None if checkpoint_dir else owner)
    if resumed is not None:
        resume, start_step = resumed
        metric("resumed_from_step", start_step)
        print(f"finetune: resumed from {resume} at step {start_step}", flush=True)

    stop = {"sigterm": False}
    previous_sigterm = signal.signal(signal.SIGTERM, lambda *_: stop.update(sigterm=True))

    # ---- the loop
    tokens_seen = 0
    loss_sum = float("nan")  # stays NaN when a resumed run has no step left to take
    log_path = Path(model.path) / "train_log.jsonl"
    progress = (ProgressFile(Path(model.path) / PROGRESS_FILE, start_step=start_step, max_steps=max_steps,
                             status=TrainerStatus.from_env(), submitted_at=submitted_at())  # the TrainJob's status too
                if world.main else None)
    t0 = time.perf_counter()
    last_save, save_s = time.monotonic(), 0.0  # the longest checkpoint write, in seconds
    first_done = False
    if start_step >= max_steps:
        distributed.gather_time(world, "first_step")  # nothing left to train: the resumed state is the result
    # line-buffered: a killed run's log ends at its last whole step; rank 0's alone
    with (os.fdopen(bounded.open_append(log_path), "a", buffering=1) if world.main else open(os.devnull, "w")) as log:
        for step_no in range(start_step, max_steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step_no, lr=lr, warmup=warmup_steps, total=max_steps)
            loss_sum, seen = train_step(train_net, input_ids, labels, step_no=step_no, grad_accum=grad_accum,
                                        batch_size=batch_size, seed=seed, world=world, device=device,
                                        amp_dtype=amp_dtype)
            tokens_seen += seen
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum = distributed.mean_over_ranks(world, loss_sum)
            if not first_done:
                distributed.gather_time(world, "first_step")
                first_done = True
            log.write(json.dumps({"step": step_no + 1, "loss": round(loss_sum, 6),
                                  "lr": optimizer.param_groups[0]["lr"]}) + "\n")
            done = step_no + 1
            if progress is not None:
                progress.update(done, tokens_seen, time.perf_counter() - t0, loss_sum)  # loss.item() waited for the GPU
            stopping = distributed.all_agree(world, stop["sigterm"])  # every rank stops after the same step
            timed = bool(every_s) and distributed.all_agree(world, time.monotonic() - last_save >= every_s)
            if stopping or ((checkpoint_every and done % checkpoint_every == 0 or timed) and done < max_steps):
                began = time.perf_counter()
                state = train_state(net, optimizer, sharded=True) if sharded else None  # a collective under FSDP
                if world.main:
                    save_checkpoint(ckpt_root, done, net, optimizer, fingerprint, chaos_pause_s=chaos_pause_s,
                                    state=state, owner=owner)
                    # the newest whole checkpoint: what a preemption keeps (llmpack.cluster.k8s.preemption)
                    emit_step("checkpoint_saved")
                distributed.barrier(world)
                save_s, last_save = max(save_s, time.perf_counter() - began), time.monotonic()
            if stopping:
                if world.main:
                    log_checkpoint_timing(save_s)
                print(f"finetune: SIGTERM at step {done}; checkpoint written to {ckpt_root}, exiting for a retry",
                      flush=True)
                raise SystemExit(143)
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    if progress is not None:
        progress.close()
    signal.signal(signal.SIGTERM, previous_sigterm)  # a step fused after this one gets the default back

    # ---- outputs: rank 0's
    whole = None
    if sharded:  # every rank takes part in gathering the weights; rank 0 gets them
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        whole = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not world.main:
        distributed.barrier(world)  # rank 0 has written the outputs when this returns
        distributed.finish(world)
        return
    out = Path(model.path)
    save_outputs(out, net, whole, method=method, fused_evaluate=not world.distributed,
                 meta={"base_model": base_model, "method": method, "seq_len": int(seq_len), "steps": max_steps,
                       "seed": seed}, tokens_seal=seal_id(tokens_seal))
    if scratch:  # this run's checkpoints (in the output, or on the volume) are scratch once the weights are saved
        remove_scratch(ckpt_root, Path(settings.CHECKPOINT_ROOT.get() or out))  # checked real directories first
    log_checkpoint_timing(save_s)
    tokens_per_s = tokens_seen / train_s if train_s > 0 else float("nan")
    metric("train_s", train_s)
    metric("train_tokens", tokens_seen)
    metric("tokens_per_s", tokens_per_s)
    metric("final_loss", loss_sum)
    metric("params", n_params)
    if world.distributed:
        metric("world_size", world.size)
    if device.type == "cuda":
        from components.record.cost import peak_flops

        peak = peak_flops(torch.cuda.get_device_name())
        if peak:
            flops_per_token = (6 if method == "full" else 4) * n_params  # LoRA: no frozen-weight gradients
            metric("mfu", flops_per_token * tokens_per_s / (peak * world.size))  # tokens_per_s is global
    distributed.barrier(world)
    distributed.finish(world)
