"""The pod watcher against the real API server: 1,000 kwok nodes, 10,000 pods, events/s end to end and memory.

The stand-in's figures (``watcher_bench.py``, ``watcher_load.py``) measure the watcher taking a stream
our own server makes; this one puts it on the real control plane (``tools/cluster/up.sh``): one run
group of ``--pods`` pods, created here as bare pods owned (not controlled) by a suspended Job, which
kwok completes; :class:`llmpack.cluster.k8s.watcher.PodWatcher` in a fresh process watches them from before
the first is created until every one has terminated (**live**: events/s end to end, CPU, peak memory),
then a second fresh watcher stops at its first analysis (**backlog**: one list of every pod).

    python benchmarks/watcher_real.py [--nodes 1000] [--pods 10000] [--kubeconfig FILE [--existing]] [--timeout S]

Without ``--kubeconfig`` it starts and stops its own control plane; needs ``make cluster-build``.
Loopback only. Minutes on 2 cores. What each figure means, ``--existing`` and INCOMPLETE:
docs/internals/real-cluster.md, "The watcher benchmark on the real control plane";
the figures: docs/internals/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools" / "cluster"
NAMESPACE = "llmpack-bench"
RUN_GROUP = "bench-real"


def watch(kubeconfig: str, pods: int, timeout_s: float, *, backlog: bool = False) -> dict[str, Any]:
    """One PodWatcher run in this process, traced: its figures. ``backlog``: stop at the first analysis (the list)."""
    import kubernetes

    from llmpack.cluster.k8s.podphases import all_terminated
    from llmpack.cluster.k8s.watcher import PodWatcher

    api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    watcher = PodWatcher(api, NAMESPACE, RUN_GROUP, window_s=60)
    tracemalloc.start()
    start, cpu = time.perf_counter(), time.process_time()
    rows = watcher.run(until=(lambda rows: True) if backlog else all_terminated(min_pods=pods), timeout_s=timeout_s)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"stopped_by": watcher.stopped_by, "rows": len(rows), "pods": len({r["pod"] for r in rows}),
            "succeeded": sum(1 for r in rows if r["phase"] == "Succeeded"),
            "terminated": sum(1 for r in rows if r["phase"] in ("Succeeded", "Failed")),
            "nodes": len({r["node"] for r in rows if r["node"]}), "events": watcher.stats["events"],
            "stats": watcher.stats, "seconds": elapsed, "cpu_s": cpu, "peak_mib": peak / 2**20,
            "maxrss_mib": peak_rss_mib(), "warnings": watcher.warnings[:3]}


def peak_rss_mib() -> float:
    """This process's peak resident size: Linux's VmHWM, which an exec starts afresh. ``ru_maxrss`` does not:
    the kernel carries it over from the parent that forked this process (the benchmark's 761 MiB was that)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * (1024 if sys.platform == "darwin" else 1))


def _child(kubeconfig: str, pods: int, timeout_s: float, *, backlog: bool = False) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--kubeconfig", kubeconfig, "--pods", str(pods),
           "--timeout", str(timeout_s), *(("--backlog",) if backlog else ())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"watcher process failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _pod(i: int, owner: dict[str, Any]) -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/bench@sha256:" + "0" * 64, "command": ["true"],
                 "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
    labels = {"llmpack.io/run-group": RUN_GROUP, "llmpack.io/step": "prepare_data",
              "llmpack.io/pipeline-run": RUN_GROUP}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"bench-{i:05d}", "labels": labels, "ownerReferences": [owner]},
            "spec": {"restartPolicy": "Never", "containers": [container]}}


def create_pods(kubeconfig: str, pods: int) -> float:
    """The namespace, a suspended Job to own the pods, and ``pods`` pods, 16 requests at a time: seconds taken."""
    import kubernetes
    from kubernetes import client

    api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    api.configuration.connection_pool_maxsize = 16
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    job = batch.create_namespaced_job(NAMESPACE, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bench-owner"},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "registry.example/bench@sha256:" + "0" * 64}]}}}})
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "bench-owner", "uid": job.metadata.uid}
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: core.create_namespaced_pod(NAMESPACE, _pod(i, owner), _preload_content=False),
                      range(pods)))
    return time.perf_counter() - start


def _up(nodes: int, state: Path) -> str:
    groups = {"groups": [{"name": "h100", "count": nodes, "gpus": 8, "cpu": "192", "memory": "2048Gi",
                          "gpuProduct": "NVIDIA-H100-80GB-HBM3", "instanceType": "p5.48xlarge"}]}
    node_file = state.parent / "nodes.json"
    node_file.write_text(json.dumps(groups))
    env = {**os.environ, "LLMPACK_CLUSTER_DIR": str(state), "LLMPACK_CLUSTER_NODES": str(node_file),
           "LLMPACK_CLUSTER_API_QPS": "500"}
    start = time.perf_counter()
    done = subprocess.run([str(TOOLS / "up.sh")], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"up.sh failed: {done.stderr[-2000:]}")
    print(f"control plane with {nodes} kwok nodes up in {time.perf_counter() - start:.0f} s", flush=True)
    return str(state / "kubeconfig")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--kubeconfig", help="an already started control plane (else one is started)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="the live watcher's limit, seconds")
    parser.add_argument("--existing", action="store_true",
                        help="with --kubeconfig: the run group is already there (an earlier run's pods, in flight "
                             "or done); watch it from now instead of creating it")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backlog", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(watch(args.kubeconfig, args.pods, args.timeout, backlog=args.backlog)))
        return 0
    if args.existing and not args.kubeconfig:
        parser.error("--existing needs --kubeconfig")
    tmp = Path(tempfile.mkdtemp(prefix="llmpack-watcher-real-"))
    state = tmp / "state"
    kubeconfig = args.kubeconfig or _up(args.nodes, state)
    try:
        import kubernetes
        from kubernetes import client

        if not args.existing:
            api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
            client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
            time.sleep(2)  # the namespace's default ServiceAccount (pods need it)
        live = _child(kubeconfig, args.pods, args.timeout)
        if not args.existing:
            time.sleep(3)  # the watcher's first list and watch
            made_s = create_pods(kubeconfig, args.pods)
            print(f"{args.pods} pods created in {made_s:.0f} s ({args.pods / made_s:.0f}/s)", flush=True)
        _report("live", _result(live), args.pods)
        _report("backlog", _result(_child(kubeconfig, args.pods, args.timeout, backlog=True)), args.pods)
    finally:
        if not args.kubeconfig:
            subprocess.run([str(TOOLS / "down.sh")], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "LLMPACK_CLUSTER_DIR": str(state)})
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _report(name: str, r: dict[str, Any], pods: int) -> None:
    """One line of figures; a run that did not see every pod terminate says so and how far it got."""
    ok = r["stopped_by"] == "condition" and r["pods"] == pods and (name == "backlog" or r["succeeded"] == pods)
    print(f"{name}: {'complete' if ok else 'INCOMPLETE (' + str(r['stopped_by']) + ')'}: {r['pods']} pods on "
          f"{r['nodes']} nodes, {r['terminated']} terminated; {r['events']} events in {r['seconds']:.1f} s = "
          f"{r['events'] / r['seconds']:.0f} events/s end to end; watcher CPU {r['cpu_s']:.1f} s "
          f"({r['events'] / max(r['cpu_s'], 1e-9):.0f} events per CPU s); peak {r['peak_mib']:.1f} MiB "
          f"(tracemalloc), peak RSS {r['maxrss_mib']:.0f} MiB; {r['stats']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
