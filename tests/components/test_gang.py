"""finetune on many nodes: the launcher creates a TrainJob, the gang trains, the record has every rank.

``llmpack compile --nodes 2 --gpus 4`` is checked against the Trainer API's models and its CRD schema
(its committed golden copies, examples/multinode/, in tests/backends/test_golden.py). The launcher
runs for real (``python -m components.run`` with ``nnodes=2``, a slow test) against the loopback
Kubernetes API and the real ``kubernetes`` client; a stand-in Trainer controller plays the
``torch-distributed`` runtime: it starts the TrainJob's command once per node, with the ``PET_*``
variables the runtime sets, as local processes sharing a directory (the PVC), and sets the TrainJob
``Complete`` or ``Failed``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from standins.k8s_api import KubeAPIStandIn

from components.record.telemetry import group_by_step, read_records
from components.trainjob import gang
from tests.components.test_trainjob import _schema, schema_errors, trainer_api_errors
from tests.conftest import llmpack, run_step
from tests.sealing import for_run

TOKEN = "gang-standin-token-4471"
NS = "llmpack"
TUNE = "components.steps.finetune:finetune"


def test_the_trainjob_every_path_creates_validates(tmp_path: Path) -> None:
    r = llmpack("compile", "--nodes", "2", "--gpus", "4", "--cache-pvc", "shared", "--queue", "team-a",
                "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    obj = yaml.safe_load((tmp_path / "c" / "trainjob" / "finetune-trainjob.yaml").read_text())
    assert trainer_api_errors(obj) == [] and schema_errors(obj, _schema()) == []
    assert obj["spec"]["trainer"]["numNodes"] == 2 and obj["spec"]["trainer"]["numProcPerNode"] == 4
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    # every path's finetune task is the small launcher pod; its parameters carry the gang
    wf = yaml.safe_load((tmp_path / "c" / "argo_workflows" / "finetune.yaml").read_text())
    tmpl = next(t for t in wf["spec"]["templates"] if t["name"] == "finetune")
    assert "nvidia.com/gpu" not in json.dumps(tmpl["container"]["resources"]) and "tolerations" not in tmpl
    args = {p["name"]: p.get("value") for p in wf["spec"]["arguments"]["parameters"]}
    assert args["nnodes"] == "2" and json.loads(args["trainjob"])["claim"] == "shared"
    project = yaml.safe_load((tmp_path / "c" / "mlflow_projects" / "finetune" / "MLproject").read_text())
    assert project["entry_points"]["main"]["parameters"]["nnodes"]["default"] == 2
    kfp = (tmp_path / "c" / "kfp_pipelines" / "finetune.yaml").read_text()
    assert "nnodes" in kfp and "llmpack-gang" not in kfp  # the run's paths are the launcher's business
    for bad, says in ((("--nodes", "2"), "pass --cache-pvc"), (("--queue", "q"), "give --nodes 2 or more"),
                      (("--nodes", "2", "--cache-pvc", "s", "--fuse", "all"), "drop --fuse")):
        r = llmpack("compile", *bad, "--out", str(tmp_path / "bad"), cwd=tmp_path)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# --------------------------------------------------------------------------- the gang, end to end


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TrainerController:
    """Plays the Trainer's torch-distributed runtime for TrainJobs created in the stand-in."""

    def __init__(self, kube: KubeAPIStandIn) -> None:
        self.kube = kube
        self.seen: list[dict] = []
        self.threads: list[threading.Thread] = []
        kube.on_custom_object_created = self.created

    def created(self, obj: dict) -> None:
        self.seen.append(obj)
        thread = threading.Thread(target=self.run, args=(obj,), daemon=True)
        thread.start()
        self.threads.append(thread)

    def run(self, obj: dict) -> None:
        trainer = obj["spec"]["trainer"]
        command = list(trainer["command"])
        assert command[0] == "torchrun"
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
        nodes, port = trainer["numNodes"], _free_port()
        env = {**os.environ, **{e["name"]: e["value"] for e in trainer.get("env", [])}, "GLOO_SOCKET_IFNAME": "lo",
               "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "LLMPACK_MLFLOW_LOGGING": "0"}
        procs = [subprocess.Popen(command, env={**env, "PET_NODE_RANK": str(i)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for i in range(nodes)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        ok = all(p.returncode == 0 for p in procs)
        meta = obj["metadata"]
        self.kube.set_trainjob_condition(meta["namespace"], meta["name"], "Complete" if ok else "Failed", "True",
                                         message="" if ok else outs[0][-500:])


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for the stand-in API server, with the token it wants, in namespace NS."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": NS}}]}))
    return path


@pytest.mark.slow  # four torch processes; the quick many-process run is test_distributed's
def test_a_two_node_finetune_trains_as_a_trainjob_and_records_every_rank(tokens: Path, finetuned: Path,
                                                                         tmp_path: Path) -> None:
    shared = tmp_path / "pvc"
    shared.mkdir()
    spec = gang.GangSpec(image="ghcr.io/llmpack/llmpack:0.1.0", gpus_per_node=0, cpu=1, memory="2Gi",
                         claim="shared", mount=str(shared), queue="team-a")
    steps = ("--param=max_steps=6", "--param=batch_size=4")
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1",
           "LLMPACK_GANG_SPECS": gang.spec_digest(spec)}  # as compile --nodes pins it in the launcher's pod

    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,)) as kube:
        controller = TrainerController(kube)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
        out = tmp_path / "gang"
        run_tokens = for_run(tokens, tmp_path / "run-g1-tokens", "run-g1")  # a run takes only its own run's outputs
        r = run_step(TUNE, f"--input=tokens={run_tokens}", f"--output=model={out}", *steps, "--param=nnodes=2",
                     f"--param=trainjob={spec.to_json()}", "--param=pipeline_run=run-g1", "--param=run_group=rg-g1",
                     cwd=tmp_path, env={**env, "KUBECONFIG": str(kubeconfig)})
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(controller.seen) == 1
        job = controller.seen[0]
        assert job["spec"]["trainer"]["numNodes"] == 2 and job["metadata"]["namespace"] == NS
        assert job["metadata"]["labels"]["llmpack.io/pipeline-run"] == "run-g1"
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"

    # the same steps as one process: 2 nodes x 1 rank over the same global batch
    losses = [[json.loads(x)["loss"] for x in (d / "train_log.jsonl").read_text().splitlines()]
              for d in (finetuned, out)]
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(*losses, strict=True)) and len(losses[1]) == 6
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert not list(out.glob("llmpack-events.rank*.jsonl")) and not (shared / gang.GANG_DIR / "run-g1").exists()
    step = group_by_step(read_records([out / "llmpack-events.jsonl"]))["finetune"]
    ev = step.events
    for rank in (0, 1):
        assert {f"process_started.rank{rank}", f"first_step.rank{rank}", f"finished.rank{rank}"} <= set(ev), sorted(ev)
    assert (ev["process_started"] < ev["trainjob_created"]
            < min(ev["process_started.rank0"], ev["process_started.rank1"]))
    assert ev["first_step"] == max(ev["first_step.rank0"], ev["first_step.rank1"]) <= ev["finished"]
    assert step.metrics["world_size"] == 2


@pytest.mark.parametrize("field", ['"env": []', '"labels": "team=x"', '"mounts": ["pvc"]', '"node_selector": 3',
                                   '"mounts": [{"claim": "c"}]'])
def test_a_hand_edited_gang_spec_of_the_wrong_shape_is_one_line(field: str) -> None:
    """The ``trainjob`` run parameter can be overridden at submit: a wrong shape fails at parse, not in the launcher."""
    from components.errors import InputError
    from components.trainjob.gang import GangSpec

    text = '{"image": "x", "gpus_per_node": 1, "cpu": 1, "memory": "1Gi", "claim": "c", ' + field + "}"
    with pytest.raises(InputError, match="^trainjob: not a gang spec as llmpack compile --nodes writes it"):
        GangSpec.from_json(text, "trainjob")


def _compiled_launcher() -> tuple[str, str]:
    """The committed multinode Argo Workflow's finetune launcher: its pinned digests and its ``trainjob`` default."""
    from components import settings
    from tests.conftest import REPO

    wf = yaml.safe_load((REPO / "examples" / "multinode" / "argo_workflows" / "finetune.yaml").read_text())
    (tmpl,) = [t for t in wf["spec"]["templates"] if t["name"] == "finetune"]
    env = {e["name"]: e.get("value") for e in tmpl["container"]["env"]}
    params = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}
    return env[settings.GANG_SPECS.name], params[gang.TRAINJOB_PARAM]


def test_the_compiled_gang_spec_is_pinned_in_the_launchers_environment_on_every_path() -> None:
    """Compile writes the spec's digest into the launcher pod (not a parameter); the compiled value passes."""
    from components import settings
    from tests.conftest import REPO

    pinned, default = _compiled_launcher()
    spec = gang.GangSpec.from_json(default, "trainjob")
    assert pinned == gang.spec_digest(spec)
    gang.check_compiled(spec, "trainjob", env={settings.GANG_SPECS.name: pinned})
    base = REPO / "examples" / "multinode"
    for rel in ("kfp_pipelines/finetune.yaml", "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml"):
        assert f"value: {pinned}" in (base / rel).read_text(), rel


def test_a_run_whose_trainjob_parameter_names_another_image_is_refused(tmp_path: Path) -> None:
    """The launcher as every path runs it (``python -m components.run`` finetune, nnodes=2), with the compiled
    environment and a ``trainjob`` run parameter naming another image: exit 2, one line, no TrainJob created."""
    from components import settings

    pinned, default = _compiled_launcher()
    shared = tmp_path / "pvc"
    shared.mkdir()
    evil = json.loads(default)
    evil.update(image="ghcr.io/attacker/miner:latest", mount=str(shared))
    honest = {**json.loads(default), "mount": str(shared)}
    (tmp_path / "tokens").mkdir()
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", settings.GANG_SPECS.name: pinned}
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,)) as kube:
        created: list[dict] = []
        kube.on_custom_object_created = created.append
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
        for spec in (evil, honest):  # the mount moved too: a placement change is refused alike
            r = run_step(TUNE, f"--input=tokens={tmp_path / 'tokens'}", f"--output=model={tmp_path / 'out'}",
                         "--param=nnodes=2", f"--param=trainjob={json.dumps(spec)}", "--param=pipeline_run=run-x",
                         cwd=tmp_path, env={**env, "KUBECONFIG": str(kubeconfig)})
            assert r.returncode == 2, r.stdout + r.stderr
            lines = [ln for ln in r.stderr.strip().splitlines() if "not a gang spec compiled" in ln]
            assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
            assert f"image {spec['image']!r}" in lines[0]
        # the compiled value itself passes the check (and stops at the next one here: no volume at its mount)
        r = run_step(TUNE, f"--input=tokens={tmp_path / 'tokens'}", f"--output=model={tmp_path / 'out'}",
                     "--param=nnodes=2", f"--param=trainjob={default}", "--param=pipeline_run=run-x",
                     cwd=tmp_path, env={**env, "KUBECONFIG": str(kubeconfig)})
        assert r.returncode == 2 and "not a gang spec compiled" not in r.stderr, r.stderr
        assert "the shared volume is not mounted" in r.stderr, r.stderr
        assert created == []  # refused before anything reached the API
        assert not (shared / gang.GANG_DIR).exists()  # nor the shared volume


# --------------------------------------------------------------------------- no --nodes: no gang at all

def _hostile_spec(shared: Path) -> dict:
    """A gang spec a run might pass to a pipeline compiled without --nodes: another image, a Secret, a PVC."""
    return {"image": "ghcr.io/attacker/miner:latest", "gpus_per_node": 8, "cpu": 1, "memory": "1Gi",
            "claim": "other-team-data", "mount": str(shared),
            "secret_env": [{"env": "T", "secret": "other-team-token", "key": "token"}],
            "mounts": [{"volume": "loot", "claim": "other-team-models", "path": "/loot"}]}


def test_a_pipeline_compiled_without_nodes_launches_no_gang_whatever_the_run_says(tmp_path: Path) -> None:
    """The finetune step as the committed (no --nodes) pipelines run it: no ``LLMPACK_GANG_SPECS`` in its pod.
    Any ``nnodes`` but 1, or any ``trainjob``, is one line and exit 2; nothing reaches the API or the volume."""
    from tests.conftest import REPO

    wf = yaml.safe_load((REPO / "argo_workflows" / "finetune.yaml").read_text())
    (tmpl,) = [t for t in wf["spec"]["templates"] if t["name"] == "finetune"]
    assert "LLMPACK_GANG_SPECS" not in json.dumps(tmpl)  # the committed pod pins no gang
    shared = tmp_path / "pvc"
    shared.mkdir()
    (tmp_path / "tokens").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LLMPACK_GANG_SPECS"}
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,)) as kube:
        created: list[dict] = []

        def fail_it(obj: dict) -> None:  # were one created, end it at once (the test must not hang)
            created.append(obj)
            meta = obj["metadata"]
            threading.Timer(0.2, kube.set_trainjob_condition,
                            (meta["namespace"], meta["name"], "Failed", "True")).start()

        kube.on_custom_object_created = fail_it
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
        spec = json.dumps(_hostile_spec(shared))
        for params in (("--param=nnodes=2", f"--param=trainjob={spec}"),
                       ("--param=nnodes=1", f"--param=trainjob={spec}"), ("--param=nnodes=3",)):
            r = run_step(TUNE, f"--input=tokens={tmp_path / 'tokens'}", f"--output=model={tmp_path / 'out'}", *params,
                         "--param=pipeline_run=run-x", cwd=tmp_path,
                         env={**env, "LLMPACK_MLFLOW_LOGGING": "0", "KUBECONFIG": str(kubeconfig)})
            assert r.returncode == 2, (params, r.stdout + r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and "compiled without --nodes" in lines[0], (params, r.stderr)
            assert "attacker" not in r.stderr and "other-team" not in r.stderr
        assert created == []
        assert list(shared.iterdir()) == [] and not (tmp_path / "out").exists()  # nothing copied, nothing made


def test_submit_refuses_a_gang_on_a_package_compiled_without_nodes(tmp_path: Path) -> None:
    """``submit kfp/argo/mlflow`` of the committed (no --nodes) packages with ``nnodes``/``trainjob`` set: one
    InputError before any connection (KFP would have picked the launcher's service account for it)."""
    from argo_workflows import submit as argo_submit
    from components.errors import InputError
    from kfp_pipelines import submit as kfp_submit
    from mlflow_projects import submit as mlflow_submit

    spec = json.dumps(_hostile_spec(tmp_path))
    nowhere = "http://127.0.0.1:9"  # nothing listens: reaching the network would be another error
    for params in ({"nnodes": 2, "trainjob": spec}, {"trainjob": spec}, {"nnodes": "4"}):
        for submit in (lambda p: kfp_submit.submit(kfp_submit.Request(host=nowhere, token="t", params=p)),
                       lambda p: argo_submit.submit(argo_submit.Request(host=nowhere, token="t", params=p)),
                       lambda p: mlflow_submit.submit(mlflow_submit.Request(
                           kubeconfig=str(tmp_path / "none"), tracking_uri=f"sqlite:///{tmp_path}/m.db", params=p))):
            with pytest.raises(InputError, match="compiled without --nodes") as info:
                submit(params)
            assert "attacker" not in str(info.value)
    # a package compiled with --nodes keeps nnodes a run parameter (the spec stays pinned by its digest)
    pinned, default = _compiled_launcher()
    gang.check_pinned({"nnodes": 4}, "x", compiled={"nnodes": 2, "trainjob": default})
    gang.check_pinned({"nnodes": 4, "trainjob": default}, "x", env={"LLMPACK_GANG_SPECS": pinned})
    with pytest.raises(InputError, match="compiled without --nodes"):
        gang.check_compiled(gang.GangSpec.from_json(default, "trainjob"), "trainjob", env={})
