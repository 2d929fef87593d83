"""finetune: LoRA (peft) or full fine-tuning of a causal LM on packed sequences.

Read it top to bottom: load data, build the model, the optimizer and the schedule, resume from
the newest checkpoint if one exists, then the loop. Checkpoints (trainable weights, optimizer,
scheduler, RNG states, data position) are written atomically every ``checkpoint_every`` steps
and when SIGTERM arrives, so a preempted GPU node loses at most one interval.

A SIGKILL can land anywhere, a checkpoint write included, so a checkpoint is trusted only when
it proves itself whole: ``manifest.json`` (each file's size and sha256) is written after the
files and before the rename that publishes the directory, and ``newest_checkpoint`` skips any
``step-*`` directory whose files do not match it (one half removed when the process was killed
while replacing or pruning it). ``.tmp-*`` directories are writes that never reached their
rename: never resumed from, removed by the next write of that step or a later one.
``benchmarks/chaos_sigkill.py`` kills the step at random moments and checks each restart ends
byte-identical to an uninterrupted run.

While it trains, ``llmpack-progress.json`` beside the step's events says how far it is (step k of
N, tokens/s, ETA), so ``llmpack`` shows the same live progress whichever orchestrator ran it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components import settings
from components.dsl import GPU_TOLERATION, Dataset, Execution, Input, Model, Output, Resources, Retry, step
from components.errors import InputError
from components.reporting import metric
from components.training.modeling import MODEL_META, device_and_dtype, keep_tuned, load_base_model, lora_target_modules

MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
PROGRESS_FILE = "llmpack-progress.json"
# Test hook for benchmarks/chaos_sigkill.py, not a setting: seconds save_checkpoint sleeps after
# writing the state and before the manifest and the rename, so a kill can be aimed at that window.


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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk, not just to the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A checkpoint directory's manifest, or None when it has no readable one."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint; None when every file matches its manifest."""
    manifest = read_manifest(path)
    if manifest is None:
        return f"no valid {MANIFEST}"
    if STATE_FILE not in manifest["files"]:
        return f"{MANIFEST} lists no {STATE_FILE}"
    for name, want in manifest["files"].items():
        file = path / name
        if not isinstance(want, dict):
            return f"{MANIFEST} entry for {name} is not an object"
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != want.get("bytes"):
            return f"{name} has {file.stat().st_size} bytes, the manifest says {want.get('bytes')}"
        if _sha256(file) != want.get("sha256"):
            return f"{name} does not match the sha256 in the manifest"
    return None


def newest_checkpoint(
    root: Path, fingerprint: str | None = None, on_skip: Callable[[Path, str], None] | None = None
) -> Path | None:
    """The newest complete checkpoint, of this very run's settings when ``fingerprint`` is given.

    Newest first, the first ``step-*`` directory whose files match its manifest wins; each
    incomplete one passed over is reported to ``on_skip(path, why)``.
    """
    for path in sorted(root.glob("step-*"), reverse=True):
        manifest = read_manifest(path)
        if manifest is not None and fingerprint is not None and manifest.get("fingerprint") != fingerprint:
            continue  # another run's checkpoint in a shared checkpoint_dir
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if on_skip is not None:
            on_skip(path, problem)
    return None


def write_manifest(path: Path, step_no: int, fingerprint: str) -> None:
    """List every file in ``path`` with its size and sha256, after flushing them to disk."""
    files = {}
    for file in sorted(p for p in path.iterdir() if p.is_file() and p.name != MANIFEST):
        _fsync(file)
        files[file.name] = {"bytes": file.stat().st_size, "sha256": _sha256(file)}
    manifest = path / MANIFEST
    manifest.write_text(json.dumps({"step": step_no, "fingerprint": fingerprint, "files": files}, indent=2) + "\n")
    _fsync(manifest)


def prune_checkpoints(root: Path, newest: Path) -> None:
    """Keep the newest two checkpoints; remove older ones and unfinished writes of earlier steps."""
    for old in sorted(p for p in root.glob("step-*") if p != newest)[:-1]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):
        if stale.name < f".tmp-{newest.name}":  # ".tmp-step-00000004-<pid>" sorts before ".tmp-step-00000006"
            shutil.rmtree(stale, ignore_errors=True)


def train_state(model: Any, optimizer: Any, *, sharded: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainable weights, optimizer state) as whole CPU tensors; under FSDP a collective every rank calls
    (rank 0 gets the gathered state, the others empty dicts)."""
    if not sharded:
        return {k: v.detach().cpu() for k, v in model.named_parameters() if v.requires_grad}, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    wanted = {k for k, v in model.named_parameters() if v.requires_grad}
    weights = {k: v for k, v in get_model_state_dict(model, options=whole).items() if k in wanted}
    return weights, get_optimizer_state_dict(model, optimizer, options=whole)


def save_checkpoint(
    root: Path, step_no: int, model: Any, optimizer: Any, fingerprint: str = "", *, chaos_pause_s: float = 0.0,
    state: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> Path:
    """Write to a temporary directory, manifest last, then rename: a checkpoint is complete or absent.

    ``state``: the (trainable, optimizer) state :func:`train_state` gathered, when the model is sharded.
    """
    import numpy as np
    import torch

    final = root / f"step-{step_no:08d}"
    tmp = root / f".tmp-step-{step_no:08d}-{os.getpid()}"
    for stale in root.glob(f".tmp-step-{step_no:08d}-*"):  # a killed attempt's unfinished write of this step
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainable, optimizer_state = state if state is not None else train_state(model, optimizer)
    torch.save(
        {
            "step": step_no,
            "trainable": trainable,
            "optimizer": optimizer_state,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "numpy": np.random.get_state(),
            },
        },
        tmp / STATE_FILE,
    )
    if chaos_pause_s > 0:
        time.sleep(chaos_pause_s)  # test hook (settings.CHAOS_CHECKPOINT_PAUSE_S.name): a window to kill the write in
    write_manifest(tmp, step_no, fingerprint)
    shutil.rmtree(final, ignore_errors=True)  # this step's leftover: torn (not resumed from) or another run's
    os.replace(tmp, final)
    _fsync(root)  # the rename itself survives a node crash
    prune_checkpoints(root, final)
    return final


def load_checkpoint(path: Path, model: Any, optimizer: Any, *, sharded: bool = False) -> int:
    """Restore weights, optimizer and RNG states from a checkpoint ``newest_checkpoint`` chose; its step.

    ``sharded`` (FSDP): every rank reads the whole state and keeps its shards.
    """
    import numpy as np
    import torch

    state = torch.load(path / STATE_FILE, weights_only=False)
    if sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        whole = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, state["trainable"], options=whole)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=whole)
    else:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in state["trainable"].items():
                params[name].copy_(value)
        optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    if torch.cuda.is_available() and state["rng"]["cuda"]:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    np.random.set_state(state["rng"]["numpy"])
    return int(state["step"])


def _report_skipped(path: Path, why: str) -> None:
    print(f"finetune: skipping incomplete checkpoint {path} ({why})", flush=True)


class ProgressFile:
    """Step k of N, tokens/s and ETA in a tiny JSON file, replaced atomically at most every ``every_s``.

    The throttle and the missing fsync are deliberate: a watcher only needs a recent value, and
    the loop must not wait on the disk.
    """

    def __init__(self, path: Path, *, start_step: int, max_steps: int, every_s: float = 0.5) -> None:
        self.path, self.start_step, self.max_steps, self.every_s = path, start_step, max_steps, every_s
        self.written_at = -math.inf
        self._write({"step": start_step, "max_steps": max_steps, "tokens_per_s": None, "eta_s": None})

    def update(self, step_no: int, tokens: int, elapsed_s: float) -> None:
        """Record ``step_no`` steps done; written only when ``every_s`` has passed, and at the last step."""
        if time.monotonic() - self.written_at < self.every_s and step_no < self.max_steps:
            return
        s_per_step = elapsed_s / max(1, step_no - self.start_step)
        self._write({"step": step_no, "max_steps": self.max_steps,
                     "tokens_per_s": tokens / elapsed_s if elapsed_s > 0 else None,
                     "eta_s": s_per_step * (self.max_steps - step_no)})

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({**state, "updated_at": time.time()}))
        os.replace(tmp, self.path)  # a reader sees the old file or the new one, never half of one
        self.written_at = time.monotonic()


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
    max_steps: int = 60,
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
    described by ``trainjob`` (components.process.gang; the ranks see only the world torchrun gives them).
    """
    import numpy as np
    import torch

    from components.training import distributed

    if max_steps <= 0:
        raise InputError(f"max_steps is {max_steps}; must be > 0")
    if method not in ("lora", "full"):
        raise InputError(f"method {method!r}: use 'lora' or 'full'")
    if batch_size <= 0 or grad_accum <= 0:
        raise InputError("batch_size and grad_accum must be > 0")
    if strategy not in ("ddp", "fsdp"):
        raise InputError(f"strategy {strategy!r}: use 'ddp' or 'fsdp'")
    world = distributed.world_from_env() if distributed.is_rank() else distributed.World()
    if world.distributed and batch_size % world.size:
        raise InputError(f"batch_size {batch_size} does not split over {world.size} processes; use a multiple of {world.size}")
    chaos_pause_s = float(os.environ.get(settings.CHAOS_CHECKPOINT_PAUSE_S.name) or 0)  # a test hook, 0 in real runs

    # ---- determinism and device
    torch.manual_seed(seed)
    np.random.seed(seed)
    device, amp_dtype = device_and_dtype()
    if world.distributed:
        device = distributed.init(world)  # this rank's GPU (NCCL), or the CPU (Gloo)
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)

    # ---- data: packed blocks, prompt tokens already masked (-100)
    src = Path(tokens.path)
    input_ids = torch.from_numpy(np.load(src / "train_input_ids.npy"))
    labels = torch.from_numpy(np.load(src / "train_labels.npy"))
    seq_len = input_ids.shape[1]

    # ---- model
    net = load_base_model(base_model)
    blocks = set(getattr(net, "_no_split_modules", None) or ())  # the decoder block class names FSDP shards by
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        targets = lora_target_modules(net)  # every linear layer but the head, from the architecture
        config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
        net = get_peft_model(net, config)
        net.peft_config["default"].base_model_name_or_path = base_model
        net.peft_config["default"].target_modules = targets  # peft keeps a set: its saved order follows the hash seed
    net.to(device)
    net.train()
    distributed.gather_time(world, "model_loaded")
    train_net = net
    sharded = world.distributed and strategy == "fsdp"
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for module in list(net.modules()):
            if type(module).__name__ in blocks:
                fully_shard(module)
        fully_shard(net)  # the rest (embeddings, norm, head); train_net is net, sharded in place
    elif world.distributed:
        from torch.nn.parallel import DistributedDataParallel

        train_net = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    n_params = sum(p.numel() for p in net.parameters())
    trainable = [p for p in net.parameters() if p.requires_grad]

    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))

    # ---- resume: the newest checkpoint of these very settings and data whose files all match
    # its manifest (a shared checkpoint_dir must not hand one run's state to another)
    ckpt_root = Path(checkpoint_dir) if checkpoint_dir else Path(model.path) / "checkpoints"
    fingerprint = hashlib.sha256(
        json.dumps([base_model, method, max_steps, batch_size, grad_accum, lr, warmup_steps, weight_decay, lora_r,
                    lora_alpha, seed] + ([world.size, strategy] if world.distributed else [])).encode()
        + hashlib.sha256(input_ids.numpy().tobytes()).digest()
    ).hexdigest()[:16]
    start_step = 0
    resume = newest_checkpoint(ckpt_root, fingerprint, on_skip=_report_skipped)
    if resume is not None:
        start_step = load_checkpoint(resume, net, optimizer, sharded=sharded)
        metric("resumed_from_step", start_step)
        print(f"finetune: resumed from {resume} at step {start_step}", flush=True)

    stop = {"sigterm": False}
    previous_sigterm = signal.signal(signal.SIGTERM, lambda *_: stop.update(sigterm=True))

    # ---- the loop
    tokens_seen = 0
    loss_sum = float("nan")  # stays NaN when a resumed run has no step left to take
    log_path = Path(model.path) / "train_log.jsonl"
    progress = (ProgressFile(Path(model.path) / PROGRESS_FILE, start_step=start_step, max_steps=max_steps)
                if world.main else None)
    t0 = time.perf_counter()
    first_done = False
    if start_step >= max_steps:
        distributed.gather_time(world, "first_step")  # nothing left to train: the resumed state is the result
    # line-buffered: a killed run's log ends at its last whole step; rank 0's alone
    with (log_path.open("a", buffering=1) if world.main else open(os.devnull, "w")) as log:
        for step_no in range(start_step, max_steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step_no, lr=lr, warmup=warmup_steps, total=max_steps)
            loss_sum = 0.0
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
                loss_sum += loss.item()
                tokens_seen += x.numel() * world.size
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum = distributed.mean_over_ranks(world, loss_sum)
            if not first_done:
                distributed.gather_time(world, "first_step")
                first_done = True
            log.write(json.dumps({"step": step_no + 1, "loss": round(loss_sum, 6), "lr": optimizer.param_groups[0]["lr"]}) + "\n")
            done = step_no + 1
            if progress is not None:
                progress.update(done, tokens_seen, time.perf_counter() - t0)  # loss.item() above already waited for the GPU
            stopping = distributed.all_agree(world, stop["sigterm"])  # every rank stops after the same step
            if stopping or (checkpoint_every and done % checkpoint_every == 0 and done < max_steps):
                state = train_state(net, optimizer, sharded=True) if sharded else None  # a collective under FSDP
                if world.main:
                    save_checkpoint(ckpt_root, done, net, optimizer, fingerprint, chaos_pause_s=chaos_pause_s, state=state)
                distributed.barrier(world)
            if stopping:
                print(f"finetune: SIGTERM at step {done}; checkpoint written, exiting for a retry", flush=True)
                raise SystemExit(143)
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
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
    weights_dir = out / ("adapter" if method == "lora" else "full")
    net.save_pretrained(weights_dir, safe_serialization=True, **({"state_dict": whole} if whole is not None else {}))
    if not world.distributed:
        keep_tuned(out, net)  # for evaluate, when it runs fused in this process
    (out / MODEL_META).write_text(
        json.dumps({"base_model": base_model, "method": method, "seq_len": int(seq_len), "steps": max_steps, "seed": seed}, indent=2, sort_keys=True)
        + "\n"
    )
    if not checkpoint_dir:  # checkpoints inside the output are scratch once the weights are saved
        shutil.rmtree(ckpt_root, ignore_errors=True)
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
