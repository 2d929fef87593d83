"""Try every cluster command without a cluster: the loopback stand-ins, ready for a first run.

Starts, on 127.0.0.1, the stand-ins the tests use (a Kubernetes API, a KFP API and an Argo Server that
speak the real wire protocols, one cluster by a fake controller that plays each submitted run), holding
what docs/first-run-on-a-cluster.md says to apply, so ``llmpack cluster doctor`` passes; ``--fault NAME``
breaks one thing, to see its line and fix. Run from the repository root (it imports tests/standins/):

    python examples/loopback_cluster.py -- llmpack cluster doctor          # run one command against it, then stop
    python examples/loopback_cluster.py --fault pvc-rwo -- llmpack cluster doctor --nodes 2 --gpus 4
    python examples/loopback_cluster.py                            # serve; paste the printed exports
    python examples/loopback_cluster.py --list-faults

Without a command it prints ``export`` lines for another shell and serves until Ctrl-C; the kubeconfig
and the MLflow store go into ``--dir`` (default: a new temporary directory). The walk-through:
docs/first-run-on-a-cluster.md, "Try it without a cluster".
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the stand-ins live with the tests

from standins.loopback import LoopbackCluster  # noqa: E402
from standins.ready_cluster import FAULTS, plant_fault, plant_ready  # noqa: E402


def environment(cluster: LoopbackCluster) -> dict[str, str]:
    """What a shell needs to talk to the loopback cluster as to a real one."""
    return {"KUBECONFIG": str(cluster.kubeconfig), "KFP_HOST": cluster.kfp.url, "KFP_TOKEN": cluster.kfp_token,
            "ARGO_SERVER": cluster.argo.url, "ARGO_TOKEN": cluster.argo_token, "ARGO_NAMESPACE": "llmpack",
            "ARGO_SECURE": "false", "MLFLOW_TRACKING_URI": cluster.tracking_uri}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=sorted(FAULTS), help="break one thing of the ready cluster")
    parser.add_argument("--list-faults", action="store_true", help="list the faults and exit")
    parser.add_argument("--dir", type=Path, default=None, help="where the kubeconfig and MLflow store go")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- COMMAND...: run it against the cluster, then stop")
    args = parser.parse_args(argv)
    if args.list_faults:
        for name, (what, _) in FAULTS.items():
            print(f"{name:22} {what}")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix="llmpack-loopback-") as tmp:  # removed when it stops
            return serve(Path(tmp), args.fault, command)
    args.dir.mkdir(parents=True, exist_ok=True)
    return serve(args.dir.resolve(), args.fault, command)


def serve(workdir: Path, fault: str | None, command: list[str]) -> int:
    """Start the loopback cluster in ``workdir``; run ``command`` against it, or serve until Ctrl-C."""
    with LoopbackCluster(workdir, f"sqlite:///{workdir / 'mlflow.db'}") as cluster:
        plant_ready(cluster.kube)
        if fault:
            plant_fault(cluster.kube, fault)
        env = environment(cluster)
        if command:
            return subprocess.run(command, env={**os.environ, **env}, check=False).returncode
        for name, value in env.items():
            print(f"export {name}={value}")
        print(f"# loopback cluster up{f' with fault {fault}' if fault else ''}; Ctrl-C stops it", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops it as Ctrl-C does
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
