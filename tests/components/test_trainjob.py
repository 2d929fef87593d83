"""The Kubeflow Trainer v2 TrainJob builder (components/trainjob/spec.py).

Every built object is checked two ways against Kubeflow Trainer v2.3.0:

- the ``kubeflow-trainer-api`` 2.3.0 pydantic models: ``TrainerV1alpha1TrainJob.from_dict`` checks
  types (StrictInt, StrictStr...) but silently drops fields it does not know, so the object must
  also come back unchanged from ``to_dict()``: a misspelt field is then reported by its path;
- the CRD's openAPIV3Schema (``tests/fixtures/trainer/trainjobs.schema.json``, copied from the
  CRD, provenance in its ``$comment``) with the small structural validator below: types, required
  fields, unknown fields, maps, list limits and keys, string limits and patterns, integer bounds
  and the CRD's CEL rules on a new object. ``jsonschema`` is not a dependency of the pack, and it
  would not know the Kubernetes extensions (int-or-string, list-map keys, CEL) anyway.

Regenerate the golden YAML with ``LLMPACK_REGEN_GOLDEN=1 pytest tests/components/test_trainjob.py``.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.dsl import GPU_TOLERATION, Toleration
from components.errors import InputError
from components.gpu_nodes import node_affinity
from components.trainjob.spec import CONTAINER_SECURITY, POD_SECURITY, QUEUE_LABEL, TrainJobSpec, to_yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "trainer"
SCHEMA_FILE = FIXTURES / "trainjobs.schema.json"
GOLDEN = FIXTURES / "trainjob-2x4.yaml"

LABELS = {"llmpack.io/run-group": "rg-20261201-072611-1b4c20", "llmpack.io/pipeline-run": "argo-abc123",
          "llmpack.io/step": "finetune"}
COMMAND = ["torchrun", "-m", "components.run", "finetune", "--max-steps", "60"]


def spec(**overrides: Any) -> TrainJobSpec:
    """The 2 nodes x 4 GPUs TrainJob of the tests, with ``overrides``."""
    kwargs: dict[str, Any] = dict(
        name="llm-finetune-abc123", namespace="ml-team", image="ghcr.io/llmpack/llmpack:0.1.0",
        command=COMMAND, num_nodes=2, gpus_per_node=4, cpu=16, memory="128Gi",
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        tolerations=(GPU_TOLERATION,
                     Toleration(key="dedicated", operator="Equal", value="training", effect="NoExecute")),
        labels=LABELS, env={"PYTHONUNBUFFERED": "1"}, queue="gpu-queue",
    )
    kwargs.update(overrides)
    return TrainJobSpec(**kwargs)


CASES = {
    "2x4-queue-placement": dict(),
    "2x4-no-queue": dict(queue=None),
    "2x4-no-placement-no-labels": dict(node_selector={}, tolerations=(), labels={}, env={}, queue=None),
    "1x0-cpu": dict(num_nodes=1, gpus_per_node=0, cpu=0.5, memory="2Gi", tolerations=()),
    "8x8-namespaced-runtime-deadline": dict(num_nodes=8, gpus_per_node=8, runtime="llm-torch",
                                            runtime_kind="TrainingRuntime", active_deadline_s=86400),
    "only-tolerations": dict(node_selector={}, labels={}, queue=None,
                             tolerations=(Toleration(key="", operator="Exists", effect=""),)),
    "2x8-gpu-type-affinity": dict(gpus_per_node=8, node_selector={}, node_affinity=node_affinity("nvidia-a100-80gb"),
                                  volume=("llmpack-shared", "/var/cache/llmpack/huggingface")),
}


# --------------------------------------------------------------------------- validators


def trainer_api_errors(obj: dict[str, Any]) -> list[str]:
    """What the kubeflow-trainer-api models refuse in ``obj``: a type error, or a field they dropped."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
    from pydantic import ValidationError

    try:
        model = TrainerV1alpha1TrainJob.from_dict(obj)
    except (ValidationError, ValueError) as exc:
        return [f"model: {str(exc).splitlines()[0]}"]
    return _differences(obj, model.to_dict(), "")


def _differences(sent: Any, back: Any, path: str) -> list[str]:
    if isinstance(sent, dict) and isinstance(back, dict):
        out = [f"{path}.{k}: unknown field (dropped by the model)" for k in sent if k not in back]
        out += [f"{path}.{k}: added by the model" for k in back if k not in sent]
        for k in sent.keys() & back.keys():
            out += _differences(sent[k], back[k], f"{path}.{k}")
        return out
    if isinstance(sent, list) and isinstance(back, list) and len(sent) == len(back):
        return [e for i, (s, b) in enumerate(zip(sent, back, strict=True)) for e in _differences(s, b, f"{path}[{i}]")]
    return [] if sent == back and type(sent) is type(back) else [f"{path}: {sent!r} came back as {back!r}"]


def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


# The CRD's CEL rules that apply to a new object; transition rules (``oldSelf``) only run on updates.
CEL_RULES = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')":
        lambda v: re.search("^[a-z]([-a-z0-9]*[a-z0-9])?$", v["metadata"]["name"]) is not None,
    "size(self.metadata.name) <= 63": lambda v: len(v["metadata"]["name"]) <= 63,
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')":
        lambda v: v == "" or re.search("^[A-Za-z][A-Za-z0-9+.-]*://.+$", v) is not None,
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']":
        lambda v: v in ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"),
    "has(self.lastUpdatedTime)": lambda v: "lastUpdatedTime" in v,
}
INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Where ``value`` breaks the structural ``schema`` of a CRD (the keywords its openAPIV3Schema uses)."""
    where = path or "<root>"
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [f"{where}: {value!r} is not an integer or a string"]
        if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
            return [f"{where}: {value!r} does not match {schema['pattern']}"]
        return []
    if "anyOf" in schema and not any(not schema_errors(value, s, path) for s in schema["anyOf"]):
        return [f"{where}: {value!r} matches none of anyOf"]
    kind = schema.get("type")
    checks = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind in checks and not isinstance(value, checks[kind]):
        return [f"{where}: {value!r} is not a {kind}"]
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{where}: {value!r} is not an integer"]
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return [f"{where}: {value!r} is not a number"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if kind == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                errors += schema_errors(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += schema_errors(item, extra, f"{path}.{key}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
        errors += [f"{path}.{key}: required" for key in schema.get("required", []) if key not in value]
        if len(value) < schema.get("minProperties", 0):
            errors.append(f"{where}: fewer than {schema['minProperties']} properties")
    elif kind == "array":
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{where}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, dict)]
            if len(seen) != len(set(seen)):
                errors.append(f"{where}: duplicate list-map keys {keys}")
        if schema.get("x-kubernetes-list-type") == "set" and len({json.dumps(v) for v in value}) != len(value):
            errors.append(f"{where}: duplicate set items")
    elif kind == "string":
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: length {len(value)} outside "
                          f"[{schema.get('minLength', 0)}, {schema.get('maxLength')}]")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    elif kind in ("integer", "number"):
        low, high = INT_RANGE.get(schema.get("format", ""), (None, None))
        low = (max(x for x in (low, schema.get("minimum")) if x is not None)
               if (low, schema.get("minimum")) != (None, None) else None)
        high = (min(x for x in (high, schema.get("maximum")) if x is not None)
                if (high, schema.get("maximum")) != (None, None) else None)
        if (low is not None and value < low) or (high is not None and value > high):
            errors.append(f"{where}: {value} outside [{low}, {high}]")
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            errors.append(f"{where}: CEL rule this validator does not know: {rule['rule']}")
        elif not errors and not check(value):
            errors.append(f"{where}: {rule.get('message', rule['rule'])}")
    return errors


# --------------------------------------------------------------------------- the built objects


@pytest.mark.parametrize("case", CASES)
def test_trainjob_passes_the_trainer_api_models(case):
    obj = spec(**CASES[case]).build()
    assert trainer_api_errors(obj) == []


@pytest.mark.parametrize("case", CASES)
def test_trainjob_passes_the_crd_schema(case):
    obj = spec(**CASES[case]).build()
    assert schema_errors(obj, _schema()) == []


def test_golden_trainjob_yaml_two_nodes_four_gpus():
    fresh = to_yaml(spec().build())
    if os.environ.get("LLMPACK_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(fresh, encoding="utf-8")
    assert fresh == GOLDEN.read_text(encoding="utf-8"), (
        f"{GOLDEN.name} is stale: regenerate with LLMPACK_REGEN_GOLDEN=1")
    assert yaml.safe_load(fresh) == spec().build()


def test_two_nodes_four_gpus_fields():
    obj = spec().build()
    assert (obj["apiVersion"], obj["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert obj["metadata"] == {"name": "llm-finetune-abc123", "namespace": "ml-team",
                               "labels": {**LABELS, QUEUE_LABEL: "gpu-queue"}}
    assert obj["spec"]["runtimeRef"] == {"name": "torch-distributed", "kind": "ClusterTrainingRuntime",
                                         "apiGroup": "trainer.kubeflow.org"}
    trainer = obj["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4
    assert trainer["command"] == COMMAND and trainer["image"] == "ghcr.io/llmpack/llmpack:0.1.0"
    assert trainer["resourcesPerNode"] == {"limits": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"},
                                           "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"}}
    assert trainer["env"] == [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    (patch,) = obj["spec"]["runtimePatches"]
    assert patch["manager"] == "llmpack.io/trainjob"
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    pod = job["template"]["spec"]["template"]
    assert pod["metadata"] == {"labels": LABELS}  # the pods carry the llmpack.io labels, not the queue's
    assert pod["spec"] == {
        "serviceAccountName": "llmpack-trainer",  # no Role, no token mounted (launcher-rbac.yaml)
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoExecute"}],
        # 4 GPUs a node: NCCL's shared memory, memory-backed as on every path's multi-GPU pod
        # bounded at 8Gi a GPU (it counts against the pod's memory); /tmp: the read-only root's one writable place
        "volumes": [{"name": "tmp", "emptyDir": {}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}],
        "containers": [{"name": "node", "securityContext": {"allowPrivilegeEscalation": False,
                                                            "capabilities": {"drop": ["ALL"]},
                                                            "readOnlyRootFilesystem": True, "runAsNonRoot": True},
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                         {"name": "dshm", "mountPath": "/dev/shm"}]}],
    }


def test_without_queue_there_is_no_kueue_label_and_without_placement_only_the_security_context():
    assert QUEUE_LABEL not in spec(queue=None).build()["metadata"]["labels"]
    bare = spec(**CASES["2x4-no-placement-no-labels"], gpus_per_node=1).build()
    assert "labels" not in bare["metadata"] and "env" not in bare["spec"]["trainer"]
    (patch,) = bare["spec"]["runtimePatches"]  # Pod Security restricted, whatever else is asked
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod == {"spec": {"serviceAccountName": "llmpack-trainer", "securityContext": POD_SECURITY,
                            "volumes": [{"name": "tmp", "emptyDir": {}}],
                            "containers": [{"name": "node", "securityContext": CONTAINER_SECURITY,
                                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}]}}
    assert CONTAINER_SECURITY["readOnlyRootFilesystem"] is True


def test_a_gpu_types_affinity_and_the_shared_volume_reach_the_node_pods():
    obj = spec(**CASES["2x8-gpu-type-affinity"]).build()
    pod = obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    assert pod["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": node_affinity("nvidia-a100-80gb")}
    assert "nodeSelector" not in pod["spec"]["template"]["spec"]
    (node,) = pod["spec"]["template"]["spec"]["containers"]
    assert node["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"},
                                    {"name": "llmpack-shared", "mountPath": "/var/cache/llmpack/huggingface"},
                                    {"name": "dshm", "mountPath": "/dev/shm"}]


def test_cpu_only_requests_no_gpu_and_runs_one_process_per_node():
    trainer = spec(**CASES["1x0-cpu"]).build()["spec"]["trainer"]
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "500m", "memory": "2Gi"},
                                           "limits": {"cpu": "500m", "memory": "2Gi"}}
    assert trainer["numProcPerNode"] == 1 and trainer["numNodes"] == 1


def test_build_is_a_fresh_copy_and_the_spec_keeps_its_own_inputs():
    command, labels = list(COMMAND), dict(LABELS)
    job = spec(command=command, labels=labels)
    command.append("--oops")
    labels["llmpack.io/step"] = "changed"
    first = job.build()
    first["spec"]["trainer"]["command"].append("--mutated")
    first["metadata"]["labels"].clear()
    assert job.build() == spec().build()


# --------------------------------------------------------------------------- the validators reject


def test_trainer_api_models_reject_a_misspelt_field():
    obj = spec().build()
    obj["spec"]["trainer"]["numNode"] = obj["spec"]["trainer"].pop("numNodes")
    assert trainer_api_errors(obj) == [".spec.trainer.numNode: unknown field (dropped by the model)"]
    deep = spec().build()
    pod_spec = deep["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod_spec["template"]["spec"]["template"]["spec"]["nodeSelectors"] = {"a": "b"}
    assert [e.split(":")[0] for e in trainer_api_errors(deep)] == [
        ".spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec.nodeSelectors"
    ]


def test_trainer_api_models_reject_a_wrong_type():
    obj = spec().build()
    obj["spec"]["trainer"]["numNodes"] = "2"
    assert trainer_api_errors(obj) and trainer_api_errors(obj)[0].startswith("model:")


@pytest.mark.parametrize(("mutate", "error"), [
    (lambda o: o["spec"]["trainer"].__setitem__("numNode", 2), ".spec.trainer.numNode: unknown field"),
    (lambda o: o["spec"].__setitem__("podTemplateOverrides", []), ".spec.podTemplateOverrides: unknown field"),
    (lambda o: o["spec"]["trainer"].__setitem__("numNodes", "2"), ".spec.trainer.numNodes: '2' is not an integer"),
    (lambda o: o["spec"]["runtimeRef"].pop("name"), ".spec.runtimeRef.name: required"),
    (lambda o: o["spec"].pop("runtimeRef"), ".spec.runtimeRef: required"),
    (lambda o: o["spec"]["trainer"]["resourcesPerNode"]["limits"].__setitem__("nvidia.com/gpu", "four"),
     ".spec.trainer.resourcesPerNode.limits.nvidia.com/gpu: 'four' does not match"),
    (lambda o: o["spec"]["trainer"].__setitem__("command", ["x"] * 129), ".spec.trainer.command: more than 128 items"),
    (lambda o: o["spec"]["trainer"]["env"].append({"name": "PYTHONUNBUFFERED", "value": "0"}),
     ".spec.trainer.env: duplicate list-map keys"),
    (lambda o: o["metadata"].__setitem__("name", "Bad_Name"), "<root>: metadata.name must match RFC 1035"),
    (lambda o: o["spec"].__setitem__("activeDeadlineSeconds", 0), ".spec.activeDeadlineSeconds: 0 outside"),
])
def test_crd_schema_check_rejects(mutate, error):
    obj = copy.deepcopy(spec().build())
    mutate(obj)
    errors = schema_errors(obj, _schema())
    assert errors and errors[0].startswith(error), errors


VALIDATED_KEYWORDS = {"type", "properties", "additionalProperties", "required", "minProperties", "items", "maxItems",
                      "maxLength", "minLength", "pattern", "enum", "minimum", "maximum", "format", "anyOf",
                      "x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
                      "x-kubernetes-validations", "x-kubernetes-map-type", "default", "$comment"}


def test_schema_validator_knows_every_keyword_the_crd_uses():
    used: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            used.update(node)
            for key, value in node.items():
                for child in (value.values() if key == "properties" else [value]):
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(_schema())
    # "rule"/"message" are the keys of x-kubernetes-validations entries, not schema keywords.
    assert used - {"rule", "message"} <= VALIDATED_KEYWORDS, sorted(used - VALIDATED_KEYWORDS)


def test_schema_fixture_names_its_source_and_license():
    comment = _schema()["$comment"]
    for part in ("kubeflow/trainer", "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
                 "658725bdae5c7e3a0854d93ac6ff492e109a22ab", "Apache License, Version 2.0"):
        assert part in comment
    assert set(_schema()["properties"]["spec"]["properties"]) >= {"runtimeRef", "trainer", "runtimePatches"}


# --------------------------------------------------------------------------- input errors


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(num_nodes=0), "num_nodes 0 must be a whole number >= 1"),
    (dict(num_nodes=-2), "num_nodes -2 must be a whole number >= 1"),
    (dict(num_nodes=True), "num_nodes True must be"),
    (dict(num_nodes=1.5), "num_nodes 1.5 must be"),
    (dict(gpus_per_node=-1), "gpus_per_node -1 must be a whole number >= 0"),
    (dict(name="Bad_Name"), "TrainJob name 'Bad_Name': must be a DNS-1123 (RFC 1035) label"),
    (dict(name="1finetune"), "TrainJob name '1finetune': must be"),
    (dict(name="a" * 64), "must be a DNS-1123"),
    (dict(name="a" * 55, num_nodes=12), "too long for 12 nodes"),
    (dict(namespace="ML"), "namespace 'ML' is not a valid DNS-1123 label"),
    (dict(image=""), "image '' must be"),
    (dict(command=[]), "command must be 1 to 128 strings"),
    (dict(command="torchrun train.py"), "command: expected a list, got str"),
    (dict(command=["torchrun", "--nnodes=2", "train.py"]),
     "command sets torchrun's --nnodes; the torch-distributed runtime"),
    (dict(command=["/usr/bin/torchrun", "--max-restarts", "3", "--node_rank", "0", "x.py"]),
     "sets torchrun's --node_rank"),
    (dict(command=["python3", "-m", "torch.distributed.run", "--standalone", "-m", "components.run"]),
     "sets torchrun's --standalone"),
    (dict(cpu=0), "cpu 0 must be a number of cores"),
    (dict(memory="lots"), "memory 'lots' is not a positive Kubernetes quantity"),
    (dict(memory="0Gi"), "memory '0Gi' is not a positive"),
    (dict(runtime_kind="PyTorchJob"),
     "runtime_kind 'PyTorchJob' must be one of ClusterTrainingRuntime, TrainingRuntime"),
    (dict(runtime="Torch Distributed"), "runtime 'Torch Distributed' is not a valid DNS-1123 subdomain"),
    (dict(queue="gpu queue"), "queue 'gpu queue' is not a valid Kueue LocalQueue name"),
    (dict(labels={"llmpack.io/run group": "x"}), "label key 'llmpack.io/run group' is not a valid"),
    (dict(labels={"llmpack.io/step": "a" * 64}), "label llmpack.io/step="),
    (dict(labels={QUEUE_LABEL: "q"}), "label kueue.x-k8s.io/queue-name is set from queue="),
    (dict(node_selector={"gpu": "h100 80gb"}), "node selector gpu='h100 80gb'"),
    (dict(node_selector=["gpu"]), "node_selector: expected a mapping, got list"),
    (dict(env={"PET_NODE_RANK": "0"}), "env PET_NODE_RANK is set by the torch-distributed runtime"),
    (dict(env={"1BAD": "x"}), "env name '1BAD' is not a valid"),
    (dict(tolerations=(Toleration(key="gpu", operator="In"),)),
     "toleration 'gpu': operator 'In' must be Exists or Equal"),
    (dict(tolerations=(Toleration(key="gpu", value="x"),)), "toleration 'gpu': operator Exists takes no value"),
    (dict(tolerations=({"key": "gpu"},)), "tolerations must be components.dsl.Toleration, got dict"),
    (dict(active_deadline_s=0), "active_deadline_s 0 must be"),
])
def test_input_errors_are_one_clear_line(overrides, message):
    with pytest.raises(InputError) as info:
        spec(**overrides)
    text = str(info.value)
    assert message in text and "\n" not in text, text
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("command", "flags"), [
    (["torchrun", "--max-restarts=3", "-m", "components.run", "finetune", "--nnodes", "1"], ["--max-restarts"]),
    (["torchrun", "--rdzv-backend", "c10d", "train.py", "--master-port", "1"], ["--rdzv-backend"]),
    (["torchrun", "--no-python", "python3", "train.py", "--standalone"], ["--no-python"]),
    (["python", "train.py", "--nnodes", "2"], []),
])
def test_only_torchruns_own_flags_are_checked(command, flags):
    from components.trainjob.spec import torchrun_flags

    assert torchrun_flags(command) == flags
    # the script's own flags are its business
    assert spec(command=command).build()["spec"]["trainer"]["command"] == command


def test_to_yaml_reads_back_as_the_same_object():
    obj = spec().build()
    text = to_yaml(obj)
    assert yaml.safe_load(text) == obj
    assert text.splitlines()[:2] == ["apiVersion: trainer.kubeflow.org/v1alpha1", "kind: TrainJob"]
