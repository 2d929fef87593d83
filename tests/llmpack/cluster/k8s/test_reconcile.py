"""Our GPU-hours and cost beside Argo's resourcesDuration and OpenCost's allocation (llmpack.cluster.k8s.reconcile),
and spot nodes priced from a spot column: units, then the loopback cluster with spot nodes and a stand-in OpenCost."""

from __future__ import annotations

import json
import math
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from standins.argo_server import resources_duration
from standins.loopback import LoopbackCluster
from standins.opencost import OpenCostStandIn, spot_nodes

from argo_workflows.backend import argo_metrics
from components.errors import InputError
from components.record import cost
from llmpack.cluster.k8s import reconcile
from llmpack.cluster.k8s.objects import capacity_type
from llmpack.report import accounts

SPOT_FILE = ("prices:\n  - {gpu: nvidia-h200, provider: aws, per_gpu_hour: 7.5, spot_per_gpu_hour: 3.1, "
             "source: ours, as_of: 2026-12}\n")


# --------------------------------------------------------------------------- capacity type and spot prices


@pytest.mark.parametrize(("labels", "expected"), [
    ({"karpenter.sh/capacity-type": "spot"}, "spot"),
    ({"karpenter.sh/capacity-type": "on-demand"}, "on-demand"),
    ({"karpenter.sh/capacity-type": "reserved"}, "on-demand"),
    ({"eks.amazonaws.com/capacityType": "SPOT"}, "spot"),
    ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "on-demand"),
    ({"cloud.google.com/gke-spot": "true"}, "spot"),
    ({"cloud.google.com/gke-preemptible": "true"}, "spot"),
    ({"kubernetes.azure.com/scalesetpriority": "spot"}, "spot"),
    ({"kubernetes.azure.com/scalesetpriority": "regular"}, "on-demand"),
    ({"node.kubernetes.io/instance-type": "p5en.48xlarge"}, None),
])
def test_capacity_type_from_each_provisioners_label(labels: dict[str, str], expected: str | None) -> None:
    assert capacity_type(labels) == expected


def test_a_spot_node_takes_the_spot_column_and_the_tags_say_which_price(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(SPOT_FILE)
    spot = cost.resolve_price("nvidia-h200", price_file=str(prices), env={}, capacity_type="spot")
    on_demand = cost.resolve_price("nvidia-h200", price_file=str(prices), env={}, capacity_type="on-demand")
    assert (spot.per_gpu_hour, spot.spot) == (3.1, True) and (on_demand.per_gpu_hour, on_demand.spot) == (7.5, False)
    tags = cost.cost_tags([cost.GpuUse(step="finetune", gpus=1)], spot)
    assert tags["llmpack.capacity_type"] == "spot" and tags["llmpack.price_column"] == "spot"
    assert tags["llmpack.price_per_gpu_hour"] == "3.1" and tags["llmpack.price_source"] == "file:prices.yaml"
    # The shipped table has no spot figures: on-demand, and the tags say so; the flag is the price whatever the node.
    shipped = cost.resolve_price("nvidia-h200", env={}, capacity_type="spot")
    assert shipped.per_gpu_hour == 7.912 and not shipped.spot
    assert cost.cost_tags([], shipped)["llmpack.price_column"] == "on-demand"
    flag = cost.resolve_price("nvidia-h200", flag="2", env={}, capacity_type="spot")
    assert cost.cost_tags([], flag)["llmpack.price_column"] == "flag"
    # Off a cluster (no node asked about) the tags are as before.
    assert "llmpack.capacity_type" not in cost.cost_tags([], cost.resolve_price("nvidia-h200", env={}))


@pytest.mark.parametrize("value", ["cheap", "-1", "true"])
def test_a_bad_spot_price_is_one_line_naming_the_field(tmp_path: Path, value: str) -> None:
    prices = tmp_path / "p.yaml"
    prices.write_text(f"prices:\n  - {{gpu: nvidia-h200, per_gpu_hour: 7, spot_per_gpu_hour: {value}}}\n")
    with pytest.raises(InputError, match=r"p\.yaml: prices\[0\]\.spot_per_gpu_hour"):
        cost.resolve_price("nvidia-h200", price_file=str(prices), env={})


# --------------------------------------------------------------------------- Argo's resourcesDuration


def _terminated(name: str, start: str, end: str) -> dict:
    return {"name": name, "state": {"terminated": {"startedAt": start, "finishedAt": end, "exitCode": 0}}}


def test_argo_resources_duration_is_request_times_container_run_time() -> None:
    """Argo's DurationForPod: requests (else limits, else 100m CPU / 100Mi memory) x whole seconds, per container."""
    pod = {"spec": {"initContainers": [{"name": "init"}],
                    "containers": [{"name": "wait"},
                                   {"name": "main", "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                                                  "limits": {"nvidia.com/gpu": "2", "cpu": "8"}}}]},
           "status": {"initContainerStatuses": [_terminated("init", "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z")],
                      "containerStatuses": [_terminated("wait", "2026-01-01T00:00:10Z", "2026-01-01T00:01:40Z"),
                                            _terminated("main", "2026-01-01T00:00:10Z", "2026-01-01T00:01:40Z")]}}
    got = resources_duration(pod)
    assert got["nvidia.com/gpu"] == 2 * 90
    assert got["cpu"] == 2 * 90 + int(0.1 * 90) + int(0.1 * 10)  # the request, not the limit; the defaults elsewhere
    assert got["memory"] == int(1024 / 100 * 90) + 90 + 10  # in units of 100Mi
    assert argo_metrics(got)["argo_gpu_hours"] == pytest.approx(180 / 3600)
    assert argo_metrics(None) == {}


def test_argo_standin_status_nodes_read_back_through_hera() -> None:
    """The stand-in's status.nodes (from the Kubernetes stand-in's pods), as Hera's WorkflowsService reads them."""
    from standins.argo_server import ArgoServerStandIn
    from standins.k8s_api import KubeAPIStandIn, iter_pod_states

    from argo_workflows.submit import wait_for_workflow

    with KubeAPIStandIn(token="k", namespaces=("llmpack",)) as kube, ArgoServerStandIn(token="a") as argo:
        argo.watch_pods(kube)
        wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "wf-abcde"},
              "spec": {"entrypoint": "main", "templates": [{"name": "main", "dag": {"tasks": []}}]}}
        assert argo._create("llmpack", {"workflow": wf})[0] == 200
        t0 = 1.8e9
        for step, gpu_s in (("finetune", 42), ("evaluate", 17)):
            states = list(iter_pod_states(f"wf-abcde-{step}-123{gpu_s}", namespace="llmpack",
                                          labels={"workflows.argoproj.io/workflow": "wf-abcde"},
                                          annotations={"workflows.argoproj.io/node-name": f"wf-abcde.{step}"},
                                          created=t0, scheduled=t0 + 1, node="gpu-0", sandbox=t0 + 1,
                                          initialized=t0 + 2, started=t0 + 3, finished=t0 + 3 + gpu_s, argo=True,
                                          image="img"))
            kube.apply_pod(states[-1])
        argo.set_phase("llmpack", "wf-abcde", "Succeeded")
        done = wait_for_workflow("wf-abcde", host=argo.url, token="a", namespace="llmpack", poll_s=0.01, timeout_s=5)
    assert done["status"] == "succeeded"
    assert done["resources_duration"]["nvidia.com/gpu"] == 42 + 17  # one GPU each (the stand-in's pods)
    assert argo_metrics(done["resources_duration"])["argo_gpu_hours"] == pytest.approx(59 / 3600)


def test_a_spot_nodes_label_reaches_the_pod_row() -> None:
    from standins.k8s_api import iter_pod_states, node_object

    from llmpack.cluster.k8s.podphases import analyze

    node = node_object("gpu-0", created=1.8e9 - 60, ready=1.8e9 - 30, instance_type="p5en.48xlarge",
                       gpu_product="NVIDIA-H200")
    pod = list(iter_pod_states("p", namespace="llmpack", labels={"llmpack.io/step": "finetune"}, created=1.8e9,
                               scheduled=1.8e9 + 1, node="gpu-0", initialized=1.8e9 + 2, started=1.8e9 + 3,
                               finished=1.8e9 + 9, image="img"))[-1]
    assert analyze([pod], [node])[0]["capacity_type"] is None
    node["metadata"]["labels"]["eks.amazonaws.com/capacityType"] = "SPOT"
    assert analyze([pod], [node])[0]["capacity_type"] == "spot"


def test_opencost_is_refused_off_a_cluster_and_a_bad_url_is_one_line() -> None:
    from click.testing import CliRunner

    from llmpack.cli import main

    res = CliRunner().invoke(main, ["compare", "--opencost", "http://localhost:9003"])
    assert res.exit_code == 2 and "llmpack cluster compare" in res.output
    res = CliRunner().invoke(main, ["cluster", "compare", "--backends", "argo", "--opencost", "localhost:9003"])
    assert res.exit_code == 2 and "--opencost 'localhost:9003': expected the URL" in res.output
    assert "Traceback" not in res.output


# --------------------------------------------------------------------------- OpenCost: the client's side


def _run(**metrics: float) -> dict:
    return {"orchestrator": "argo", "fuse": "none", "pipeline_run": "argo-1", "metrics": dict(metrics),
            "tags": {"llmpack.cost_basis": "node", "llmpack.price_per_gpu_hour": "4", "llmpack.capacity_type": "spot",
                     "llmpack.price_column": "on-demand", "llmpack.price_source": "aws-pricelist@2026-08"}}


def test_the_difference_with_opencost_splits_exactly_into_node_time_and_price() -> None:
    run = _run(node_gpu_hours=2.0, cost_usd=8.0, gpu_hours=0.5, argo_gpu_hours=0.4,
               opencost_gpu_hours=0.5, opencost_gpu_cost_usd=1.5, opencost_cost_usd=1.7)
    why = accounts.explain(run)
    # 8 - 1.5 = (2 - 0.5) x 4 [node time] + 0.5 x (4 - 3) [price]
    assert "+$6.50 = +$6.00 node time" in why[2] and "+$0.50 price (ours $4.00 vs OpenCost's $3.00/GPU-h)" in why[2]
    assert "no spot price in the table: priced on-demand" in why[0]
    assert "+0.100 GPU-h" in why[1]  # container account minus Argo's
    assert "adds CPU and memory" in why[3]
    gang = accounts.explain(_run(node_gpu_hours=2.0, cost_usd=8.0, gpu_hours=0.5, argo_gpu_hours=0.0,
                                  gang_ready_s=40.0))
    assert "TrainJob's node pods" in gang[1]
    (row,) = accounts.rows([run, _run(node_gpu_hours=1.0)])  # a run with neither figure has no row
    assert row["label"] == "argo" and row["ours_gpu_hours"] == 2.0 and row["opencost_gpu_cost_usd"] == 1.5


def test_without_opencost_a_flag_price_and_node_billing_are_said_plainly() -> None:
    run = _run(node_gpu_hours=1.4, cost_usd=5.6, gpu_hours=0.006, argo_gpu_hours=0.003)
    run["tags"].update({"llmpack.capacity_type": "unknown", "llmpack.price_column": "flag",
                        "llmpack.price_source": "flag"})
    why = accounts.explain(run)
    assert why[0] == "our price $4.00/GPU-h: given by --price-per-gpu-hour (unknown node)"
    assert "our 1.400 GPU-h bills the GPU nodes" in why[2] and "0.006 GPU-h our pods' containers held" in why[2]
    run["tags"]["llmpack.cost_basis"] = "container"  # billed by container: nothing more to explain
    assert len(accounts.explain(run)) == 2


def test_run_allocation_takes_the_runs_label_and_its_kfp_run_ids() -> None:
    allocs = {"argo-1/__unallocated__": {"gpuHours": 1.0, "gpuCost": 2.0, "totalCost": 3.0},
              "__unallocated__/kfp-uid": {"gpuHours": 0.5, "gpuCost": 1.0, "totalCost": 1.5},
              "kfp-1/__unallocated__": {"gpuHours": 0.25, "gpuCost": 0.5, "totalCost": 0.5},  # the KFP run's gang pods
              "other/__unallocated__": {"gpuHours": 9.0, "gpuCost": 9.0, "totalCost": 9.0}}
    assert reconcile.run_allocation(allocs, "argo-1") == {"gpuHours": 1.0, "gpuCost": 2.0, "totalCost": 3.0}
    assert reconcile.run_allocation(allocs, "kfp-1", ["kfp-uid"]) == {"gpuHours": 0.75, "gpuCost": 1.5,
                                                                      "totalCost": 2.0}
    assert reconcile.run_allocation(allocs, "nope", ["__unallocated__"]) is None


def test_opencost_unreachable_is_a_warning_not_a_failure() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runs = [{"pipeline_run": "argo-1", "orchestrator": "argo", "submitted_at": 1.8e9, "finished_at": 1.8e9 + 60,
             "metrics": {}, "warnings": []}]
    reconcile.opencost_reconcile(f"http://127.0.0.1:{port}", runs)
    assert runs[0]["metrics"] == {} and len(runs[0]["warnings"]) == 1
    assert runs[0]["warnings"][0].startswith(f"OpenCost at http://127.0.0.1:{port}: ")
    for bad in ("localhost:9003", "ftp://x", ""):
        with pytest.raises(InputError, match="--opencost"):
            reconcile.check_opencost_url(bad)


@pytest.mark.parametrize("data",
                         [[["not", "a", "set"]], [{"run/x": {"gpuHours": {"a": 1}}}], [{"run/x": {"gpuCost": "n/a"}}]])
def test_a_malformed_opencost_answer_is_a_warning_not_a_traceback(data: list) -> None:
    """An OpenCost (or a proxy before it) answering nonsense costs the comparison one warning per run."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"code": 200, "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        runs = [{"pipeline_run": "x", "orchestrator": "argo", "submitted_at": 1.8e9, "finished_at": 1.8e9 + 60,
                 "metrics": {}, "warnings": []}]
        reconcile.opencost_reconcile(f"http://127.0.0.1:{server.server_port}", runs)
    finally:
        server.shutdown()
        server.server_close()
    assert "opencost_gpu_hours" not in runs[0]["metrics"]
    assert len(runs[0]["warnings"]) == 1 and "OpenCost" in runs[0]["warnings"][0], runs[0]["warnings"]


# --------------------------------------------------------------------------- the stand-in OpenCost on its own


def test_the_opencost_standin_answers_as_opencost_does() -> None:
    from standins.k8s_api import KubeAPIStandIn

    with KubeAPIStandIn(token="t", namespaces=("llmpack",)) as kube, OpenCostStandIn(kube, gpu_hourly=4.0) as oc:
        def get(query: str) -> tuple[int, dict]:
            try:
                with urllib.request.urlopen(f"{oc.url}/allocation/compute?{query}", timeout=5) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        assert get("window=7d&aggregate=namespace") == (200, {"code": 200, "data": [{}]})
        code, body = get("aggregate=namespace")
        assert code == 400 and body["code"] == 400 and "window" in body["message"]
        assert get("window=yesterday-ish")[0] == 400
        with pytest.raises(InputError, match="HTTP 400"):
            reconcile.fetch_allocations(oc.url, 10.0, 5.0)  # end before start: OpenCost's 400, one line


# --------------------------------------------------------------------------- the loopback cluster, end to end


def _gpu_pods(script) -> list[dict]:
    return [t for t in script.pods.values() if t.get("gpu", True) and t.get("node") == script.node.get("name")]


@pytest.mark.slow
def test_compare_cluster_prints_argo_and_opencost_beside_ours_on_spot_nodes(
        loopback_env: None, tmp_path: Path, tracking_uri: str) -> None:
    from rich.console import Console

    from llmpack.cluster.compare import cluster
    from llmpack.compare.table import compare_table
    from llmpack.report import write_report

    prices = tmp_path / "prices.yaml"
    prices.write_text(SPOT_FILE)
    with LoopbackCluster(tmp_path, tracking_uri, gpu_node_hook=spot_nodes("aws")) as c, \
            OpenCostStandIn(c.kube, gpu_hourly=7.912, spot_gpu_hourly=2.9, discount=0.1) as oc:
        result = cluster.compare_cluster(**c.options(opencost=oc.url, price_file=str(prices)))
        c.fake.wait_idle()
    runs = {r["orchestrator"]: r for r in result["runs"]}
    for orch, run in runs.items():
        assert run["status"] == "succeeded", (orch, run["error"], run["warnings"])
        script, m, tags = c.fake.scripts[run["pipeline_run"]], run["metrics"], run["tags"]
        # Spot nodes (Karpenter's label) priced from the file's spot column, and the tags say so.
        assert (tags["llmpack.capacity_type"], tags["llmpack.price_column"], tags["llmpack.price_per_gpu_hour"]) == \
            ("spot", "spot", "3.1"), orch
        assert m["cost_usd"] == pytest.approx(m["node_gpu_hours"] * 3.1)
        # OpenCost: each GPU pod (1 GPU) from container start to finish widened to whole minutes, at its spot price.
        pods = _gpu_pods(script)
        assert pods, orch
        minutes = sum(math.ceil(p["finished"] / 60) - math.floor(p["started"] / 60) for p in pods)
        assert m["opencost_gpu_hours"] == pytest.approx(minutes / 60), orch
        assert m["opencost_gpu_cost_usd"] == pytest.approx(minutes / 60 * 2.9 * 0.9), orch
        assert m["opencost_cost_usd"] > m["opencost_gpu_cost_usd"]  # CPU and memory too
    # Argo's own account, read back through Hera from status.nodes: 1 GPU x whole seconds each GPU pod ran.
    argo_pods = _gpu_pods(c.fake.scripts[runs["argo"]["pipeline_run"]])
    assert runs["argo"]["metrics"]["argo_gpu_hours"] == pytest.approx(
        sum(int(p["finished"] - p["started"]) for p in argo_pods) / 3600)
    assert "argo_gpu_hours" not in runs["kfp"]["metrics"] and "argo_gpu_hours" not in runs["mlflow"]["metrics"]
    (request,) = [r for r in oc.requests if r.path == "/allocation/compute"]
    assert request.query["aggregate"] == reconcile.AGGREGATE

    console = Console(width=80, record=True, force_terminal=False)
    compare_table(result, console=console)
    text = console.export_text()
    assert "Beside Argo and OpenCost" in text and max(len(line) for line in text.splitlines()) <= 80
    for orch, run in runs.items():
        assert f"${run['metrics']['opencost_gpu_cost_usd']:,.2f}" in text
        assert f"{orch}: OpenCost bills pods" in text
    report = write_report(result, tmp_path / "report")
    md, page = (report / "report.md").read_text(), (report / "report.html").read_text()
    assert "## Beside Argo and OpenCost" in md and "<h2>Beside Argo and OpenCost</h2>" in page
    assert "spot node, spot price of file:prices.yaml" in md
    # Rebuilt from MLflow alone (llmpack report): the same figures, so the same section.
    from components.record import tracking
    from llmpack.report import runs_from_mlflow
    from llmpack.report.beside import table_rows

    rebuilt = runs_from_mlflow(tracking.client(tracking_uri), result["run_group"])
    assert sorted(cells for cells, _ in table_rows(rebuilt)) == sorted(cells for cells, _ in table_rows(result["runs"]))
