"""The twenty-eighth independent round's findings (helper sec28, issue 46); each test fails on c02aeee.

F1 (medium): pod_claims sums a template's sidecars and init containers, not its own container: 1 + 1 GPU passes.
F2 (medium-low): placement read as a set of labels: a second nodeSelectorTerm on another label (hostname, matchFields)
    is ORed in; a preferred term (Argo's preferredDuringScheduling..., KFP's weight) places nothing; both pass.
F3 (medium): GPUs the walk cannot see: an Argo resource template's manifest (a string) of 8 x B200, a KFP resourceType
    that is a runtime parameter (kfp 2.17's set_accelerator_type takes a channel) with resourceCount 8: sent.
F4 (low): a count of 1e5000 is a traceback (the refusal formats a 5,000-digit int); 1e9999999 keeps --plan busy for
    minutes (1e2000000: 119 s).
F5 (medium): safe_cut holds back a tail that begins a known secret even when the whole secret ends before it ("to be
    or not to be" then a space at the cut goes out whole, in two pieces); a hold-back can split another secret already
    checked (set order decides; the long-first case is the control).
F6 (low): own_metrics folds .attempt<N> with str.isdigit then int: a stored key loss.attempt² is a traceback.
"""

from __future__ import annotations

import copy
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.components.plan_submit import compiled_artifacts, refused  # noqa: F401 - the `compiled` fixture
from tests.components.plan_submit import finetune as _finetune
from tests.components.plan_submit import plan_file as _plan
from tests.components.plan_submit import submit as _submit


def _refused(res: Any, what: str) -> None:
    assert res.exception is None or isinstance(res.exception, SystemExit), f"{what}: {res.exception!r}"
    refused(res, what)


def _sidecar(wf: dict[str, Any]) -> None:
    _finetune(wf)["sidecars"] = [{"name": "s", "image": "ghcr.io/llmpack/llmpack:0.1.0",
                                  "resources": {"limits": {"nvidia.com/gpu": "1"}}}]


def _terms(wf: dict[str, Any]) -> list[dict[str, Any]]:
    return _finetune(wf)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


def _or_term(term: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def edit(wf: dict[str, Any]) -> None:
        _terms(wf).append(term)
    return edit


def _preferred(wf: dict[str, Any]) -> None:
    affinity = _finetune(wf)["affinity"]["nodeAffinity"]
    terms = affinity.pop("requiredDuringSchedulingIgnoredDuringExecution")["nodeSelectorTerms"]
    affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [{"weight": 1, "preference": t} for t in terms]


def _resource_template(wf: dict[str, Any]) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "x-"}, "spec": {
        "containers": [{"name": "m", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"}}}
    wf["spec"]["templates"].append({"name": "extra", "resource": {"action": "create",
                                                                  "manifest": yaml.safe_dump(pod)}})


def _count(value: str) -> Callable[[dict[str, Any]], None]:
    def edit(wf: dict[str, Any]) -> None:
        for kind in ("limits", "requests"):
            _finetune(wf)["container"]["resources"][kind]["nvidia.com/gpu"] = value
    return edit


ARGO_EDITS = {
    "f1-container-plus-a-gpu-sidecar": _sidecar,
    "f2-or-hostname-term": _or_term({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                           "values": ["b200-node-7"]}]}),
    "f2-or-match-fields": _or_term({"matchFields": [{"key": "metadata.name", "operator": "In",
                                                     "values": ["b200-node-7"]}]}),
    "f2-preferred-only": _preferred,
    "f3-resource-template-manifest": _resource_template,
    "f4-count-1e5000": _count("1e5000"),
}


@pytest.mark.parametrize("edit", ARGO_EDITS.values(), ids=ARGO_EDITS.keys())
def test_f1_to_f4_an_argo_pod_of_more_gpus_or_elsewhere_is_refused(compiled: Path, tmp_path: Path,
                                                                    edit: Callable[[dict[str, Any]], None]) -> None:
    wf = copy.deepcopy(yaml.safe_load((compiled / "argo_workflows/finetune.yaml").read_text()))
    edit(wf)
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(yaml.safe_dump(wf, sort_keys=False))
    res = _submit(["argo", "--host", "http://127.0.0.1:9", "--workflow", str(workflow)], _plan(tmp_path))
    _refused(res, "a finetune pod of 2+ GPUs or off H200 nodes")


KFP_EDITS = {
    "f3-resource-type-a-runtime-parameter": (
        "count: '1'\n            resourceCount: '1'\n            resourceType: nvidia.com/gpu\n"
        "            type: nvidia.com/gpu\n",
        "resourceCount: '8'\n            resourceType: '{{$.inputs.parameters[''pipelinechannel--accel'']}}'\n"),
    "f2-affinity-weighted-preferred": ("          - matchExpressions:\n", "          - weight: 1\n"
                                       "            matchExpressions:\n"),
}


@pytest.mark.parametrize("old, new", KFP_EDITS.values(), ids=KFP_EDITS.keys())
def test_f2_f3_a_kfp_finetune_of_8_or_placed_by_preference_is_refused(compiled: Path, tmp_path: Path, old: str,
                                                                      new: str) -> None:
    text = (compiled / "kfp_pipelines/finetune.yaml").read_text()
    assert old in text
    package = tmp_path / "p.yaml"
    package.write_text(re.sub(re.escape(old), lambda _: new, text))
    res = _submit(["kfp", "--host", "http://127.0.0.1:9", "--package", str(package)], _plan(tmp_path))
    _refused(res, "a KFP finetune of 8 GPUs of a runtime type, or placed by preference")


def test_f4_a_huge_count_is_one_line_at_once(compiled: Path, tmp_path: Path) -> None:
    import time

    wf = copy.deepcopy(yaml.safe_load((compiled / "argo_workflows/finetune.yaml").read_text()))
    _finetune(wf)["container"]["resources"]["limits"]["nvidia.com/gpu"] = "1e200000"  # 8 bytes
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(yaml.safe_dump(wf, sort_keys=False))
    start = time.monotonic()
    res = _submit(["argo", "--host", "http://127.0.0.1:9", "--workflow", str(workflow)], _plan(tmp_path))
    _refused(res, "a count no Kubernetes accepts")
    assert time.monotonic() - start < 5, "a count no Kubernetes accepts was expanded to 200,000 digits"


PASSPHRASE = "to be or not to be"  # MLFLOW_TRACKING_PASSWORD: its first words are its last


def _copied(chunks: list[bytes]) -> bytes:
    from mlflow_projects.driver_output import copy_redacted

    it = iter([*chunks, b""])
    log = io.BytesIO()
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        copy_redacted(lambda: next(it), sink, log)
    finally:
        os.close(sink)
    return log.getvalue()


def test_f5_a_whole_passphrase_before_the_cut_is_blanked(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.redaction import redact_text

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSPHRASE)
    assert PASSPHRASE not in redact_text(f"x {PASSPHRASE} y"), "blanked in a line of its own"
    log = _copied([b"x" * 65536 + b" " + PASSPHRASE.encode() + b" tail", b"more\n"])
    assert PASSPHRASE.encode() not in log, "held back at its own last words: cut inside it, each half unredacted"


@pytest.mark.parametrize("order", [["ZZto", "tok abc"], ["tok abc", "ZZto"]], ids=["short-first", "long-first"])
def test_f5_a_hold_back_never_splits_another_secret(order: list[str]) -> None:
    from mlflow_projects.driver_output import safe_cut

    data = b"y" * 100 + b" ZZtok "
    sent = data[:safe_cut(data, order, len(data)) + 1]  # type: ignore[arg-type]  # a set, iterated in either order
    assert not sent.endswith((b"Z", b"ZZ", b"ZZt")), f"secret ZZto cut after {sent[-3:]!r}"


@pytest.mark.parametrize("key", ["metric.ft.loss.attempt\u00b2", "metric.ft.loss.attempt" + "9" * 5000],
                         ids=["superscript-two", "5000-digits"])
def test_f6_a_stored_metric_key_never_crashes_the_report(key: str) -> None:
    from llmpack.report.own_metrics import from_mlflow_metrics

    assert from_mlflow_metrics({key: 1.0, "metric.ft.loss": 2.0})["ft"]
