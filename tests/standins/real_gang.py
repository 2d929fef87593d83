"""A preempted TrainJob gang's node pods run the REAL finetune ranks, as processes.

:mod:`standins.gang_preemption` plays a 2-node gang's preemption in the loopback cluster's virtual
time; with ``Preemption(..., real=RealGang(...))`` what the gang keeps is measured from a real gang,
run the way the Trainer's ``torch-distributed`` runtime would run it.

In full: docs/internals/stand-ins.md, "Real finetune ranks for a preempted gang".
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from standins.real_pods import ADAPTER, REPO, STEP, RealFinetune, base_env, events_in

STEP_REF = f"components.steps.{STEP}:{STEP}"
NAMESPACE = "llmpack"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainjob_pod_env(obj: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """A TrainJob's node container: its plain ``spec.trainer.env`` and its claim mounts (mount path -> claim),
    from the ``runtimePatches`` pod template (:meth:`components.trainjob.spec.TrainJobSpec.pod_patch`)."""
    env = {e["name"]: str(e["value"]) for e in obj["spec"]["trainer"].get("env") or () if "value" in e}
    mounts: dict[str, str] = {}
    for patch in obj["spec"].get("runtimePatches") or ():
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            pod = job["template"]["spec"]["template"]["spec"]
            claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes") or ()
                      if "persistentVolumeClaim" in v}
            for container in pod.get("containers") or ():
                mounts.update({m["mountPath"]: claims[m["name"]] for m in container.get("volumeMounts") or ()
                               if m["name"] in claims})
    return env, mounts


class RealGang(RealFinetune):
    """Runs a preempted run's TrainJob gang for real (see the module doc); one gang at a time.
    ``played``: pipeline_run -> what its gangs did."""

    def trainjob(self, spec: Any, run: str, nodes: int) -> dict[str, Any]:
        """The TrainJob the run's launcher creates (attempt 0), its inputs and output in the shared volume's
        stand-in: the real builder on the run's gang spec."""
        from components.trainjob.gang import GANG_DIR, build_trainjob, trainer_command, trainer_env, trainjob_name

        shared = self.claim_dir(spec.claim)
        out = shared / GANG_DIR / run / f"{STEP}-0" / "out" / "model"
        out.mkdir(parents=True, exist_ok=True)
        params = {"max_steps": self.steps, "batch_size": self.batch_size, "checkpoint_every": self.every,
                  "pipeline_run": run}
        command = trainer_command(STEP_REF, {"tokens": str(self.tokens_for(run))}, {"model": str(out)}, params)
        return build_trainjob(spec, name=trainjob_name(run, STEP, 0), namespace=NAMESPACE, nodes=nodes,
                              command=command, labels={}, env=trainer_env(spec, 0))

    def node_env(self, obj: dict[str, Any]) -> dict[str, str]:
        """Every node pod's environment: the TrainJob's, on the claims' stand-ins (:meth:`RealFinetune.on_claims`)."""
        env, mounts = trainjob_pod_env(obj)
        return self.on_claims(env, mounts, "the TrainJob's node pods", keep=("HF_HOME",))

    def _start_gang(self, obj: dict[str, Any], env: dict[str, str]) -> list[subprocess.Popen[str]]:
        """Every node pod of the gang: the TrainJob's command with the runtime's ``PET_*`` variables."""
        trainer = obj["spec"]["trainer"]
        command = list(trainer["command"])
        assert command[0] == "torchrun", command
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
        pet = {"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(_free_port()), "GLOO_SOCKET_IFNAME": "lo"}
        return [subprocess.Popen(command, cwd=REPO, env={**base_env(), **env, **pet, "PET_NODE_RANK": str(i)},
                                 text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
                for i in range(trainer["numNodes"])]

    @staticmethod
    def _wait(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
        return [p.communicate(timeout=timeout)[0] for p in procs]

    @staticmethod
    def _out(obj: dict[str, Any]) -> Path:
        return Path(next(a.split("=", 2)[2] for a in obj["spec"]["trainer"]["command"] if a.startswith("--output=")))

    def uninterrupted(self, spec: Any, run: str, nodes: int) -> bytes:
        """The same gang run whole: the adapter to compare with."""
        obj = self.trainjob(spec, run, nodes)
        with self._one:
            procs = self._start_gang(obj, self.node_env(obj))
            texts = self._wait(procs, 300)
        if any(p.returncode for p in procs):
            raise AssertionError(f"{run}: the uninterrupted gang failed: {texts}")
        return (self._out(obj) / ADAPTER).read_bytes()

    def resume_gang(self, script: Any, fraction: float, grace_s: float) -> dict[str, Any]:
        """Gang attempt 0 preempted after ``fraction`` of its training, then gang attempt 1 from the volume.

        Returns ``delay_s`` (SIGTERM to the written checkpoint, real seconds), ``resumed`` (the restarted
        gang's ``resumed_from_step``) and ``kept`` (the steps the checkpoint holds)."""
        from components.trainjob.gang import rank_events_file

        run, nodes = script.pipeline_run, script.gang["nodes"]
        obj = self.trainjob(script.gang["spec"], run, nodes)
        env, out = self.node_env(obj), self._out(obj)
        at_step = min(self.steps - 1, max(1, int(fraction * self.steps)))
        log = out / "train_log.jsonl"
        with self._one:
            old = self._start_gang(obj, env)
            deadline = time.monotonic() + 300
            while not (log.exists() and len(log.read_text().splitlines()) >= at_step):
                if any(p.poll() is not None for p in old) or time.monotonic() > deadline:
                    raise AssertionError(f"{run}: the gang ended before the moment: {self._wait(old, 60)}")
                time.sleep(0.005)
            sent = time.time()
            victim = old[-1]
            victim.send_signal(signal.SIGTERM)  # the preempted node pod's kubelet
            texts0 = [""] * len(old)
            texts0[-1] = victim.communicate(timeout=120)[0]
            for p in old[:-1]:  # the victim's Job failed: JobSet deletes the other node pods
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            texts0[:-1] = self._wait(old[:-1], 120)
            exited = time.time()
            ev0, _ = events_in(rank_events_file(out, 0))
            if "checkpoint_saved" not in ev0:
                raise AssertionError(f"{run}: the gang did not checkpoint on SIGTERM: {texts0}")
            if exited - sent > grace_s:
                raise AssertionError(f"{run}: the gang's SIGTERM checkpoint took {exited - sent:.2f} s, over the "
                                     f"{grace_s} s grace")
            kept = len(log.read_text().splitlines())
            new = self._start_gang(obj, env)  # JobSet's restart: every node pod again, the same TrainJob
            texts1 = self._wait(new, 300)
        if any(p.returncode for p in new):
            raise AssertionError(f"{run}: the restarted gang failed: {texts1}")
        _, m1 = events_in(rank_events_file(out, 0))
        self.played[run] = {"env": env, "at_step": at_step, "kept": kept, "out": out,
                            "exit": [[p.returncode for p in old], [p.returncode for p in new]],
                            "stdout": [texts0, texts1], "events": ev0, "metrics": m1,
                            "adapter": (out / ADAPTER).read_bytes()}
        return {"delay_s": max(0.0, ev0["checkpoint_saved"] - sent), "resumed": float(m1.get("resumed_from_step", 0.0)),
                "kept": kept}

