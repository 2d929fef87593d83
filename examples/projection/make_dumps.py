"""Regenerate the example dumps of ``llmpack cluster plan project`` (examples/projection/README.md), loopback cluster.

Two stacks, as a user would measure them: Argo on nodes that come up slowly with a heavy
(lognormal) tail and pull the image every time, MLflow on nodes that come up in a narrow window and
pull a smaller image; 26 runs of a 4 x 8-GPU gang on each, then the cluster's pods, nodes and
events as ``kubectl get ... -o json`` would list them (slimmed to the fields the analysis reads).

    PYTHONPATH=$PWD python examples/projection/make_dumps.py     # from the repository root, ~3 minutes
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

RUNS, NODES, GPUS = 26, 4, 8


def main() -> None:
    import pytest
    from kubernetes import client
    from standins.loopback import LoopbackCluster, isolate
    from standins.node_paces import NodePaces, fixed, lognormal, uniform

    from llmpack.cluster.compare import cluster
    from llmpack.cluster.k8s.api import build_api_client
    from llmpack.cluster.k8s.slim import slim_event, slim_node, slim_pod

    stacks = {"argo": NodePaces(node_create=fixed(30), node_ready=lognormal(300, 0.45), pull=lognormal(90, 0.5),
                                start=fixed(2), seed=11),
              "mlflow": NodePaces(node_create=fixed(10), node_ready=uniform(90, 150), pull=uniform(30, 60),
                                  start=fixed(2), seed=12)}
    tmp = Path(tempfile.mkdtemp())
    mp = pytest.MonkeyPatch()
    isolate(mp, tmp)
    with LoopbackCluster(tmp, f"sqlite:///{tmp / 'mlflow.db'}") as c:
        for path, paces in stacks.items():
            c.fake.node_paces = paces
            result = cluster.compare_cluster(**c.options(backends=path, nodes=NODES, gpus=GPUS, repeats=RUNS))
            print(path, result["run_group"], [r["status"] for r in result["runs"]].count("succeeded"), "succeeded")
        c.fake.wait_idle()
        core = client.CoreV1Api(build_api_client(host=c.kube.url, token=c.k8s_token))
        listed = {"pods": [slim_pod(p) for p in _items(core.list_pod_for_all_namespaces(_preload_content=False))],
                  "nodes": [slim_node(n) for n in _items(core.list_node(_preload_content=False))],
                  "events": [slim_event(e) for ns in ("llmpack", "kubeflow")
                             for e in _items(core.list_namespaced_event(ns, _preload_content=False))]}
    mp.undo()
    for kind, items in listed.items():
        (HERE / f"{kind}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items},
                                                      separators=(",", ":"), sort_keys=True) + "\n")
        print(f"wrote {HERE / kind}.json ({len(items)} items)")


def _items(response: object) -> list[dict]:
    return json.loads(response.data)["items"]  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
