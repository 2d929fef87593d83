"""The preempted finetune pod and its retry pod run the REAL finetune step, as processes.

:class:`standins.preemption.Preemption` plays a preemption in the loopback cluster's virtual time;
with ``Preemption(..., real=RealFinetune(...))`` what the step keeps is no longer computed but
measured from the real step, run the way the pod would run it.

In full: docs/internals/stand-ins.md, "Real finetune processes for a preempted pod".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ROOT_ENV = "LLMPACK_CHECKPOINT_ROOT"
STEP = "finetune"
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def finetune_command(tokens: Path, out: Path, run: str, *, steps: int, batch_size: int, every: int) -> list[str]:
    """The compiled finetune task's command, small (its ``checkpoint_dir`` empty: the pod's volume decides)."""
    return [sys.executable, "-m", "components.run", "components.steps.finetune:finetune", f"--input=tokens={tokens}",
            f"--output=model={out}", f"--param=max_steps={steps}", f"--param=batch_size={batch_size}",
            f"--param=checkpoint_every={every}", f"--param=pipeline_run={run}"]


def base_env() -> dict[str, str]:
    """This machine's environment for a step process: the repo importable, offline, one thread, no MLflow."""
    return {**os.environ, "PYTHONPATH": str(REPO), "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _env_list(entries: Any) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in entries or () if "value" in e}


def artifact_env(orchestrator: str, artifact: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The finetune container's plain env and its claim mounts (mount path -> claim) in the submitted artifact:
    a KFP run (``pipeline_spec``), an Argo Workflow, an MLflow Job."""
    if orchestrator == "kfp":
        both = artifact["pipeline_spec"]  # {"pipeline_spec", "platform_spec"}, or the bare pipeline spec
        spec = both.get("pipeline_spec") or both
        label = f"exec-{STEP}"
        container = spec["deploymentSpec"]["executors"][label]["container"]
        platform = ((both.get("platform_spec") or {}).get("platforms") or {}).get("kubernetes") or {}
        cfg = ((platform.get("deploymentSpec") or {}).get("executors") or {}).get(label) or {}
        return _env_list(container.get("env")), {m["mountPath"]: m["constant"] for m in cfg.get("pvcMount") or []}
    if orchestrator == "argo":
        tmpl = next(t for t in artifact["spec"]["templates"] if t["name"] == STEP)
        container, volumes = tmpl["container"], tmpl.get("volumes") or artifact["spec"].get("volumes") or []
    else:
        pod = artifact["spec"]["template"]["spec"]
        container, volumes = pod["containers"][0], pod.get("volumes") or []
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v}
    mounts = {m["mountPath"]: claims[m["name"]] for m in container.get("volumeMounts") or [] if m["name"] in claims}
    return _env_list(container.get("env")), mounts


def events_of(out: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(events, metrics) the step wrote to its output's ``llmpack-events.jsonl``; the last of each name."""
    return events_in(out / "llmpack-events.jsonl")


def events_in(path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(events, metrics) in one records file (a step's, or one rank's of a gang); the last of each name."""
    events: dict[str, float] = {}
    metrics: dict[str, float] = {}
    for rec in map(json.loads, path.read_text().splitlines() if path.exists() else ()):
        (events if rec["kind"] == "event" else metrics if rec["kind"] == "metric" else {})[rec["name"]] = rec["value"]
    return events, metrics


_SEALING = threading.Lock()  # one run's tokens sealed once, whichever pod asks first


@dataclass
class RealFinetune:
    """Runs a preempted run's finetune attempts for real (see the module doc); one run at a time."""

    tokens: Path                     # the real tokenize output
    workdir: Path                    # the pods' output dirs and the claims' stand-in dirs
    steps: int = 16
    batch_size: int = 4
    every: int = 4
    played: dict[str, dict[str, Any]] = field(default_factory=dict)  # pipeline_run -> what its attempts did
    _one: threading.Lock = field(default_factory=threading.Lock)      # two real trainings at once: too slow here

    def claim_dir(self, claim: str) -> Path:
        return self.workdir / "pvc" / claim

    def tokens_for(self, run: str) -> Path:
        """The tokens sealed for ``run``, as the run's own tokenize would have (a run's steps take only its own
        run's outputs: tests/sealing.py)."""
        from tests.sealing import for_run

        dest = self.workdir / "tokens" / run
        with _SEALING:
            if not dest.exists():
                for_run(self.tokens, dest, run)
        return dest

    def on_claims(self, env: dict[str, str], mounts: dict[str, str], where: str,
                  keep: tuple[str, ...] = ()) -> dict[str, str]:
        """The ``LLMPACK_*`` settings (and ``keep``) of a container's ``env``, each path under a claim's mount
        (``mounts``: mount path -> claim) mapped to the claim's stand-in dir. Without a checkpoint volume
        there is nothing to resume from: an error naming ``where``."""
        out = {}
        for name, value in env.items():
            if not (name.startswith("LLMPACK_") or name in keep):
                continue
            for mount, claim in sorted(mounts.items(), key=lambda m: -len(m[0])):  # the deepest mount first
                if value == mount or value.startswith(mount.rstrip("/") + "/"):
                    value = str(self.claim_dir(claim)) + value[len(mount.rstrip("/")):]
                    break
            out[name] = value
        if ROOT_ENV not in out or not out[ROOT_ENV].startswith(str(self.workdir)):
            raise AssertionError(f"{where} has no {ROOT_ENV} on a claim (--checkpoint-pvc)")
        return out

    def pod_env(self, orchestrator: str, artifact: dict[str, Any]) -> dict[str, str]:
        """The finetune pod's settings from the artifact, on the claims' stand-ins (:meth:`on_claims`)."""
        env, mounts = artifact_env(orchestrator, artifact)
        return self.on_claims(env, mounts, f"{orchestrator}: the finetune pod")

    def _start(self, run: str, attempt: int, env: dict[str, str]) -> tuple[Path, subprocess.Popen[str]]:
        out = self.workdir / "pods" / f"{run}-{attempt}"
        cmd = finetune_command(self.tokens_for(run), out, run, steps=self.steps, batch_size=self.batch_size,
                               every=self.every)
        proc = subprocess.Popen(cmd, cwd=REPO, env={**base_env(), **env, "LLMPACK_ATTEMPT": str(attempt)}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return out, proc

    def resume(self, script: Any, fraction: float, grace_s: float) -> dict[str, Any]:
        """Attempt 0 SIGTERMed after ``fraction`` of its training, then attempt 1 from the volume.

        Returns ``delay_s`` (SIGTERM to the written checkpoint, real seconds), ``resumed`` (the retry's
        ``resumed_from_step``) and ``kept`` (the steps the checkpoint holds)."""
        run = script.pipeline_run
        env = self.pod_env(script.orchestrator, script.artifact)
        at_step = min(self.steps - 1, max(1, int(fraction * self.steps)))  # SIGTERM lands once the handler is in
        with self._one:
            out0, p0 = self._start(run, 0, env)
            log = out0 / "train_log.jsonl"
            deadline = time.monotonic() + 300
            while not (log.exists() and len(log.read_text().splitlines()) >= at_step):
                if p0.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{run}: finetune attempt 0 ended before the moment: {p0.communicate()[0]}")
                time.sleep(0.005)
            sent = time.time()
            p0.send_signal(signal.SIGTERM)
            text0, _ = p0.communicate(timeout=120)
            exited = time.time()
            ev0, _ = events_of(out0)
            if p0.returncode != 143 or "checkpoint_saved" not in ev0:
                raise AssertionError(f"{run}: attempt 0 did not checkpoint on SIGTERM (exit {p0.returncode}): {text0}")
            if exited - sent > grace_s:
                raise AssertionError(f"{run}: the SIGTERM checkpoint took {exited - sent:.2f} s, "
                                     f"over the {grace_s} s grace")
            out1, p1 = self._start(run, 1, env)
            text1, _ = p1.communicate(timeout=300)
            if p1.returncode != 0:
                raise AssertionError(f"{run}: attempt 1 failed ({p1.returncode}): {text1}")
        ev1, m1 = events_of(out1)
        kept = len((out0 / "train_log.jsonl").read_text().splitlines())
        self.played[run] = {"env": env, "at_step": at_step, "kept": kept, "exit": [p0.returncode, p1.returncode],
                            "out": [out0, out1], "stdout": [text0, text1], "events": [ev0, ev1], "metrics": m1,
                            "adapter": (out1 / ADAPTER).read_bytes()}
        return {"delay_s": max(0.0, ev0["checkpoint_saved"] - sent), "resumed": float(m1.get("resumed_from_step", 0.0)),
                "kept": kept}
