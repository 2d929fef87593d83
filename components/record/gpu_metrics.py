"""GPU utilisation on GPU steps: a sampler beside the step, and the GPU's idle time before training.

Tokens/s and MFU say how fast training ran, not whether the GPU sat idle before the first step:
so a GPU step's process samples its node's GPUs from its start (:class:`Sampler`) and logs
``gpu_idle_before_first_step_s`` (:func:`idle_seconds`), ``gpu_util_mean_pct``, ``gpu_mem_max_mb``,
``gpus_sampled`` and the samples as MLflow system-metric series; in a gang each node's first rank
samples its node. NVML first, else ``nvidia-smi``. No GPU: nothing sampled, nothing logged, never
a failed step. Why not MLflow's own monitor: docs/internals/record-internals.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components import bounded, settings
from components.errors import InputError

SAMPLES_FILE = "llmpack-gpu.jsonl"
SMI_QUERY = "index,utilization.gpu,memory.used,memory.total"
IDLE_METRIC = "gpu_idle_before_first_step_s"
SUMMARY_METRICS = (IDLE_METRIC, "gpu_util_mean_pct", "gpu_mem_max_mb", "gpus_sampled")
_MIB_MB = 1.048576  # MiB (nvidia-smi) to MB (MLflow's megabytes: bytes / 1e6)


@dataclass(frozen=True, kw_only=True)
class Reading:
    """One GPU at one instant: utilisation (% of the driver's last sample period with a kernel running) and memory."""

    gpu: int
    util_pct: float
    mem_used_mb: float
    mem_total_mb: float


@dataclass(frozen=True, kw_only=True)
class Sample:
    """Every GPU of the node, read at ``t`` (epoch seconds)."""

    t: float
    readings: tuple[Reading, ...]


Source = Callable[[], list[Reading]]


# --------------------------------------------------------------------------- sources


def parse_smi_csv(text: str) -> list[Reading]:
    """``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits``.

    A GPU whose fields read ``[N/A]`` or ``[Not Supported]`` (MIG, some drivers) is left out.
    """
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            gpu, util, used, total = int(parts[0]), float(parts[1]), float(parts[2]), float(parts[3])
        except ValueError:
            continue
        out.append(Reading(gpu=gpu, util_pct=util, mem_used_mb=used * _MIB_MB, mem_total_mb=total * _MIB_MB))
    return out


def smi_source(exe: str | None = None) -> Source | None:
    """``nvidia-smi`` on PATH, when it answers with at least one GPU; else None."""
    exe = exe or shutil.which("nvidia-smi")
    if not exe:
        return None
    command = [exe, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"]

    def read() -> list[Reading]:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5, check=True)
        return parse_smi_csv(done.stdout)

    try:
        return read if read() else None
    except (OSError, subprocess.SubprocessError):
        return None


def nvml_source(nvml: Any = None) -> Source | None:
    """NVML through ``pynvml`` (or an object shaped like it), when it initialises and sees a GPU; else None."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found, no-redef]
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - NVMLError: no driver, no GPU
        return None
    if not handles:
        return None

    def read() -> list[Reading]:
        out = []
        for i, handle in enumerate(handles):
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            out.append(Reading(gpu=i, util_pct=float(util), mem_used_mb=mem.used / 1e6, mem_total_mb=mem.total / 1e6))
        return out

    return read


def find_source() -> Source | None:
    """NVML, else nvidia-smi, else None (no GPU here)."""
    return nvml_source() or smi_source()


# --------------------------------------------------------------------------- the sampler


def samples_file(directory: Path, node: str | None) -> Path:
    return directory / (SAMPLES_FILE if node is None else f"llmpack-gpu.{node}.jsonl")


class Sampler:
    """Reads ``source`` now and every ``interval`` seconds on a daemon thread until :meth:`stop`.

    Each sample is appended to ``path`` at once (a killed step keeps what it had). A failing read
    skips that sample; nothing here raises into the step.
    """

    def __init__(self, source: Source, path: Path, *, interval: float, step: str = "", node: str | None = None) -> None:
        self.source, self.path, self.interval, self.step, self.node = source, path, max(0.05, interval), step, node
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="llmpack-gpu-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            try:
                sample = Sample(t=time.time(), readings=tuple(self.source()))
            except Exception:  # noqa: BLE001 - a failed read is a missing sample, never a failed step
                sample = None
            if sample is not None and sample.readings:
                self.samples.append(sample)
                self._write(sample)
            if self._stop.wait(self.interval):
                return

    def _write(self, sample: Sample) -> None:
        row = {"t": sample.t, "step": self.step, "node": self.node,
               "gpus": [{"gpu": r.gpu, "util_pct": r.util_pct, "mem_used_mb": round(r.mem_used_mb, 1),
                         "mem_total_mb": round(r.mem_total_mb, 1)} for r in sample.readings]}
        try:
            with os.fdopen(bounded.open_append(self.path), "a", encoding="utf-8") as fh:  # never through a link
                fh.write(json.dumps(row) + "\n")
        except (OSError, InputError):
            pass

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(timeout=2.0)  # a read in flight; a wedged nvidia-smi is left to its own 5 s timeout
        return list(self.samples)


def start(directory: Path, *, step: str = "", node: str | None = None, env: Mapping[str, str] | None = None,
          source: Source | None = None) -> Sampler | None:
    """A running sampler for this node's GPUs, or None: turned off, or no GPU/NVML/nvidia-smi here."""
    try:
        if not settings.GPU_METRICS.get(env):
            return None
        interval = settings.GPU_SAMPLE_INTERVAL_S.get(env) or 1.0
        source = source or find_source()
        if source is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        return Sampler(source, samples_file(directory, node), interval=interval, step=step, node=node).start()
    except Exception:  # noqa: BLE001 - a bad setting or an odd driver: no GPU metrics, the step runs
        return None


def node_of(env: Mapping[str, str] | None = None) -> str:
    """A gang node's id, ``node<R>``: R is the node rank torchrun gives its workers (``GROUP_RANK``)."""
    env = os.environ if env is None else env
    return f"node{env.get('GROUP_RANK') or env.get('PET_NODE_RANK') or '0'}"


# --------------------------------------------------------------------------- the derivation


def idle_seconds(samples: Sequence[Sample], start: float, end: float, threshold: float) -> float | None:
    """Seconds of ``[start, end]`` the GPUs spent below ``threshold`` % utilisation, averaged over the GPUs.

    A reading describes the driver's last sample period, so sample k holds from sample k-1 to its
    own time; the first sample holds back to ``start``, the last (when before ``end``) on to
    ``end``. None when no sample falls in or before the window, or the window is empty.
    """
    pts = sorted(samples, key=lambda s: s.t)
    if end <= start or not pts or pts[0].t > end:
        return None
    bounds = [start] + [s.t for s in pts]
    per_gpu: dict[int, float] = {}
    for k, sample in enumerate(pts):
        lo, hi = max(bounds[k], start), min(sample.t if k < len(pts) - 1 else max(sample.t, end), end)
        for r in sample.readings:
            per_gpu.setdefault(r.gpu, 0.0)
            if hi > lo and r.util_pct < threshold:
                per_gpu[r.gpu] += hi - lo
        if sample.t >= end:
            break
    return sum(per_gpu.values()) / len(per_gpu) if per_gpu else None


def summary(samples: Sequence[Sample], *, started: float, first_step: float | None,
            threshold: float) -> dict[str, float]:
    """The step's GPU metrics from its samples ({} without samples; no idle figure without a first step)."""
    readings = [r for s in samples for r in s.readings]
    if not readings:
        return {}
    out = {"gpu_util_mean_pct": sum(r.util_pct for r in readings) / len(readings),
           "gpu_mem_max_mb": max(r.mem_used_mb for r in readings),
           "gpus_sampled": float(len({r.gpu for r in readings}))}
    idle = None if first_step is None else idle_seconds(samples, started, first_step, threshold)
    if idle is not None:
        out[IDLE_METRIC] = idle
    return out


def finish(sampler: Sampler | None, tel: Any, *, started: float) -> None:
    """Stop ``sampler`` and log the step's GPU metrics through ``tel`` (a ``StepTelemetry``); never raises."""
    if sampler is None:
        return
    try:
        samples = sampler.stop()
        mine = "first_step" if tel.rank is None else f"first_step.rank{tel.rank}"
        first = next((r.value for r in reversed(tel.records) if r.kind == "event" and r.name == mine), None)
        threshold = settings.GPU_IDLE_UTIL_PCT.get()
        for name, value in summary(samples, started=started, first_step=first,
                                   threshold=5.0 if threshold is None else threshold).items():
            tel.step_metric(name if sampler.node is None else f"{name}.{sampler.node}", value)
    except Exception:  # noqa: BLE001 - GPU metrics never fail a step
        return


# --------------------------------------------------------------------------- the record


def series(step: str, samples: Mapping[str | None, Sequence[Sample]]) -> dict[str, list[tuple[int, float, float]]]:
    """MLflow system-metric series: ``system/<step>[/<node>]/gpu_<i>_...`` -> ``[(index, value, t)]``."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for node, node_samples in samples.items():
        prefix = f"system/{step}/" + (f"{node}/" if node else "")
        for n, sample in enumerate(sorted(node_samples, key=lambda s: s.t)):
            for r in sample.readings:
                out.setdefault(f"{prefix}gpu_{r.gpu}_utilization_percentage", []).append((n, r.util_pct, sample.t))
                out.setdefault(f"{prefix}gpu_{r.gpu}_memory_usage_megabytes", []).append((n, r.mem_used_mb, sample.t))
    return out


def sampled_series(sampler: Sampler | None) -> dict[str, list[tuple[int, float, float]]]:
    """This process's series for the record (a gang's other nodes upload theirs); {} without a sampler."""
    return {} if sampler is None else series(sampler.step, {sampler.node: sampler.samples})


def read_series(root: str | os.PathLike[str] | None) -> dict[str, list[tuple[int, float, float]]]:
    """Every step's series from the ``llmpack-gpu*.jsonl`` files under ``root`` (a run directory), for the
    client's upload and ``llmpack sync``; {} on a CPU run. A cut-short last line is skipped."""
    per_step: dict[str, dict[str | None, list[Sample]]] = {}
    for path in sorted(Path(root).rglob("llmpack-gpu*.jsonl")) if root is not None and Path(root).is_dir() else []:
        for line in bounded.iter_lines(path):  # a symlink, FIFO or device, an over-long line: one InputError
            try:
                row = json.loads(line)
                sample = Sample(t=float(row["t"]), readings=tuple(
                    Reading(gpu=int(g["gpu"]), util_pct=float(g["util_pct"]), mem_used_mb=float(g["mem_used_mb"]),
                            mem_total_mb=float(g["mem_total_mb"])) for g in row["gpus"]))
                step, node = str(row["step"]), row.get("node")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            per_step.setdefault(step, {}).setdefault(node, []).append(sample)
    return {key: points for step, nodes in per_step.items() for key, points in series(step, nodes).items()}


def derived(step_metrics: Mapping[str, float]) -> dict[str, float | None]:
    """The run's GPU figures from the training step's metrics: a gang's idle is its slowest node's, its
    utilisation the nodes' mean; None (left off the record) where nothing was sampled."""
    def values(name: str) -> list[float]:
        return [v for k, v in step_metrics.items() if k == name or k.startswith(f"{name}.node")]

    idle, util = values(IDLE_METRIC), values("gpu_util_mean_pct")
    return {IDLE_METRIC: max(idle) if idle else None, "gpu_util_mean_pct": sum(util) / len(util) if util else None}
