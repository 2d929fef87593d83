"""Many processes for one step: torchrun in the step's process (or pod), and what a rank knows.

With ``nproc_per_node`` P > 1 the step's process becomes a *launcher* (:func:`launch`): it records
``process_started``, runs ``torchrun --standalone --nproc-per-node P`` on the same arguments,
forwards SIGTERM/SIGINT, records ``finished`` and uploads the ranks' records once. Each rank runs
the step with a :class:`World` of its own and records its own ``.rank<R>`` events; the step's
``model_loaded`` and ``first_step`` are the last rank's, its metrics rank 0's reduced over the
ranks. Rank 0 writes outputs and checkpoints. Gloo on CPU, NCCL on GPU. The telemetry in full:
docs/internals/step-process.md.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from components import settings

NPROC_PARAM = "nproc_per_node"  # the step parameter that asks for more than one process
MAX_NPROC = 64


@dataclass(frozen=True, kw_only=True)
class World:
    """This process's place among the step's processes (rank 0 of 1 when not distributed)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes outputs, checkpoints and step-level records."""
        return self.rank == 0


def world_from_env(env: dict[str, str] | None = None) -> World:
    """The world torchrun (or a Trainer runtime) describes in ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``."""
    env = dict(os.environ) if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        return World()
    return World(rank=rank, size=size, local_rank=local) if size > 1 else World()


def is_rank(env: dict[str, str] | None = None) -> bool:
    """True in a process torchrun started (it has a ``RANK``), so it must not launch again."""
    env = dict(os.environ) if env is None else env
    return "RANK" in env and "WORLD_SIZE" in env


def under_our_launcher(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    return env.get(settings.LAUNCHER.name) == "1"


def check_nproc(nproc: int, where: str) -> None:
    from components.errors import InputError

    if not 1 <= nproc <= MAX_NPROC:
        raise InputError(f"{where}: {nproc} processes; must be between 1 and {MAX_NPROC}")


def init(world: World) -> Any:
    """Join the process group (NCCL on GPU, Gloo on CPU); the device this rank computes on."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        if world.local_rank >= torch.cuda.device_count():
            from components.errors import InputError

            raise InputError(f"rank {world.rank}: local rank {world.local_rank} but this node has "
                             f"{torch.cuda.device_count()} GPU(s); use at most one process per GPU")
        torch.cuda.set_device(world.local_rank)
        device = torch.device("cuda", world.local_rank)
    else:
        device = torch.device("cpu")
    if world.distributed and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def gather_time(world: World, name: str) -> None:
    """Record ``name`` for this rank now; in a gang, rank 0 also records the step's: the last rank's time."""
    from components.reporting import emit, emit_step

    now = time.time()
    emit(name, now)
    if not world.distributed:
        return
    import torch.distributed as dist

    times: list[Any] = [None] * world.size
    dist.all_gather_object(times, now)
    if world.main:
        emit_step(name, max(float(t) for t in times))


def all_agree(world: World, flag: bool) -> bool:
    """True on every rank when any rank says so (a SIGTERM seen by one rank stops them all, same step)."""
    if not world.distributed:
        return flag
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def mean_over_ranks(world: World, value: float) -> float:
    if not world.distributed:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item()) / world.size


def barrier(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


def finish(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
