"""Issue 46, items 3 and 4: a store writer cannot swap a registered model's code or weights past llmpack's
loader, and a hand-written or edited ``metrics.json`` never registers or promotes a version.

One real evaluate and register (tiny model, the session's 6-step adapter) on a sqlite store of
this module; the store's artifacts are then edited as someone with write access to it would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_step

pytestmark = pytest.mark.slow  # a register process behind every test (the store fixture): the slow tier

EVAL = "components.steps.evaluate:evaluate"
REG = "components.steps.register:register"
NAME = "signed-model"
PAYLOAD_TAG, SIGNATURE_TAG = "llmpack.provenance", "llmpack.provenance.signature"
SIGNATURE_FILE = "metrics.signature.json"  # beside metrics.json (components.serving.signed)
MARKER_CODE = """
from pathlib import Path
Path({marker!r}).write_text("the store's code ran")
"""


def _env(key_file: Path, uri: str = "") -> dict[str, str]:
    """A step's environment: this session's provenance key (a module fixture runs before the autouse one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMPACK_")}
    env.update(LLMPACK_SIGNING_KEY_FILE=str(key_file), HF_HUB_OFFLINE="1", LLMPACK_MLFLOW_LOGGING="0")
    if uri:
        env.update(LLMPACK_MLFLOW_LOGGING="1", MLFLOW_TRACKING_URI=uri)
    return env


def _register(root: Path, model: Path, metrics: Path, uri: str, key_file: Path, run: str,
              *extra: str) -> subprocess.CompletedProcess[str]:
    out = root / f"reg-{run}"
    return run_step(REG, f"--input=model={model}", f"--input=metrics={metrics}", f"--output=registration={out}",
                    f"--param=model_name={NAME}", f"--param=pipeline_run={run}", "--param=run_group=rg-prov", *extra,
                    cwd=root, env=_env(key_file, uri))


@pytest.fixture(scope="module")
def store(tokens: Path, finetuned: Path, mlflow_template_db: Path, _session_signing_key_file: Path,
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store with version 1 of ``NAME`` (champion), its evaluation's directory and the session key file."""
    from tests.conftest import fresh_store

    root = tmp_path_factory.mktemp("provenance")
    uri = fresh_store(mlflow_template_db, root / "mlflow.db")
    key = _session_signing_key_file
    r = run_step(EVAL, f"--input=tokens={tokens}", f"--input=model={finetuned}", f"--output=metrics={root / 'eval'}",
                 cwd=root, env=_env(key))
    assert r.returncode == 0, r.stderr
    r = _register(root, finetuned, root / "eval", uri, key, "pr-first")
    assert r.returncode == 0, r.stderr
    record = json.loads((root / "reg-pr-first" / "registration.json").read_text())
    assert record["version"] == "1" and record["champion"]
    return {"root": root, "uri": uri, "key": key, "eval": root / "eval", "model": finetuned, "record": record}


def _client(store: dict[str, Any]) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(store["uri"])


def _artifact(store: dict[str, Any], rel: str) -> Path:
    """Where the store keeps version 1's ``model/<rel>`` on disk (a file store: anyone with write access edits it)."""
    source = _client(store).get_model_version(NAME, "1").source
    assert source.startswith("file://"), source
    return Path(source.removeprefix("file://")) / rel


@pytest.fixture()
def edited(store: dict[str, Any]) -> Iterator[Any]:
    """``edit(rel, data)`` replaces (or adds) a file of version 1's model in the store; all put back after."""
    saved: dict[Path, bytes | None] = {}

    def edit(rel: str, data: bytes) -> Path:
        path = _artifact(store, rel)
        saved.setdefault(path, path.read_bytes() if path.exists() else None)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    yield edit
    for path, data in saved.items():
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(data)


def _verified_load_refuses(store: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    from components.serving.verify import UntrustedModel, load_model

    monkeypatch.setenv("LLMPACK_SIGNING_KEY_FILE", str(store["key"]))
    with pytest.raises(UntrustedModel) as caught:
        load_model(f"models:/{NAME}/1", tracking_uri=store["uri"], dst=tmp_path / "copy")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"models:/{NAME}/1: ")
    assert not (tmp_path / "copy").exists(), "a refused copy is left half-written"
    return message


def test_a_replaced_pyfunc_model_py_is_refused_before_any_of_it_runs(store: dict[str, Any], edited: Any,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    original = _artifact(store, "pyfunc_model.py").read_text()
    edited("pyfunc_model.py", (original + MARKER_CODE.format(marker=str(marker))).encode())
    message = _verified_load_refuses(store, monkeypatch, tmp_path)
    assert "model file pyfunc_model.py does not match the sha256 signed at registration" in message
    assert not marker.exists(), "the store's code ran"
    # the boundary docs/serving.md states: MLflow's own loader, without the check, runs it
    import mlflow.pyfunc

    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ left in the store for the next test
    mlflow.pyfunc.load_model(str(_artifact(store, "")))
    assert marker.read_text() == "the store's code ran"


def test_replaced_weights_an_added_file_or_a_removed_one_are_refused(store: dict[str, Any], edited: Any,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    weights = _artifact(store, "adapter/adapter_model.safetensors").read_bytes()
    edited("adapter/adapter_model.safetensors", weights[:-4] + b"\0\0\0\1")  # same size, other bytes
    assert "model file adapter/adapter_model.safetensors does not match" in _verified_load_refuses(
        store, monkeypatch, tmp_path / "a")
    edited("adapter/adapter_model.safetensors", weights)
    edited("code/sitecustomize.py", b"raise SystemExit('planted')\n")
    assert "model file code/sitecustomize.py was not there at registration" in _verified_load_refuses(
        store, monkeypatch, tmp_path / "b")
    _artifact(store, "code/sitecustomize.py").unlink()
    _artifact(store, "code").rmdir()
    spec = edited("serving.json", b"")
    spec.unlink()
    assert "model file serving.json is missing" in _verified_load_refuses(store, monkeypatch, tmp_path / "c")


def test_a_huge_planted_file_is_refused_from_the_listing_before_a_byte_is_downloaded(
        store: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The third check: a 3 GiB sparse file beside a signed version's files was downloaded whole (25 s, written out
    in full) before it was refused. Now the store's listing is checked first, and only the signed files are
    downloaded."""
    import mlflow.artifacts

    asked: list[str] = []
    real = mlflow.artifacts.download_artifacts
    monkeypatch.setattr(mlflow.artifacts, "download_artifacts",
                        lambda *a, **kw: asked.append(str(kw.get("artifact_uri"))) or real(*a, **kw))
    planted = _artifact(store, "zz-planted.bin")
    with open(planted, "wb") as fh:
        fh.truncate(3 << 30)
    try:
        message = _verified_load_refuses(store, monkeypatch, tmp_path)
    finally:
        planted.unlink()
    assert "model file zz-planted.bin was not there at registration" in message
    assert asked == []  # refused from the listing: nothing was downloaded, the 3 GiB least of all


def test_edited_or_copied_provenance_tags_are_refused(store: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """Whoever swaps a file and rewrites its digest in the tag cannot make the signature: the key is the user's."""
    mc = _client(store)
    tags = mc.get_model_version(NAME, "1").tags
    payload = json.loads(tags[PAYLOAD_TAG])
    try:
        forged = {**payload, "files": {**payload["files"], "pyfunc_model.py": {"sha256": "0" * 64, "bytes": 1}}}
        mc.set_model_version_tag(NAME, "1", PAYLOAD_TAG, json.dumps(forged, sort_keys=True, separators=(",", ":")))
        assert "its provenance signature does not verify" in _verified_load_refuses(store, monkeypatch,
                                                                                    tmp_path / "a")
        mc.delete_model_version_tag(NAME, "1", SIGNATURE_TAG)
        assert "no provenance signature" in _verified_load_refuses(store, monkeypatch, tmp_path / "b")
    finally:
        mc.set_model_version_tag(NAME, "1", PAYLOAD_TAG, tags[PAYLOAD_TAG])
        mc.set_model_version_tag(NAME, "1", SIGNATURE_TAG, tags[SIGNATURE_TAG])


def test_the_signed_version_loads_and_the_cli_leaves_a_checked_copy(store: dict[str, Any], edited: Any,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    from components.serving.verify import load_model

    monkeypatch.setenv("LLMPACK_SIGNING_KEY_FILE", str(store["key"]))
    model = load_model(f"models:/{NAME}@champion", tracking_uri=store["uri"])
    assert len(model.predict(["Reverse: apple", "Add: 2+3"], params={"max_new_tokens": 4})) == 2
    env = _env(store["key"], store["uri"])
    cli = [sys.executable, "-m", "components.serving.verify", f"models:/{NAME}/1"]
    ok = subprocess.run([*cli, str(tmp_path / "ok")], env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "every file matches its signed sha256" in ok.stdout and (tmp_path / "ok" / "model" / "MLmodel").is_file()
    edited("MLmodel", _artifact(store, "MLmodel").read_bytes() + b"# edited\n")
    bad = subprocess.run([*cli, str(tmp_path / "bad")], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (f"llmpack: error: models:/{NAME}/1: model file MLmodel does not "
                                                   "match the sha256 signed at registration (replaced in the store?); "
                                                   "refusing to load the model")
    assert not (tmp_path / "bad").exists()


# --------------------------------------------------------------------------- item 4: the register step's input


def _versions(store: dict[str, Any]) -> list[str]:
    return sorted(str(v.version) for v in _client(store).search_model_versions(f"name='{NAME}'"))


def _champion(store: dict[str, Any]) -> str:
    return str(_client(store).get_model_version_by_alias(NAME, "champion").version)


def _refused(r: subprocess.CompletedProcess[str], store: dict[str, Any], before: list[str], champion: str,
             expect: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in r.stderr and expect in lines[-1], r.stderr
    assert _versions(store) == before and _champion(store) == champion, "the refused input changed the registry"


def _signed_metrics(store: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, pipeline_run: str = "",
                    **changes: Any) -> Path:
    """The real evaluation with ``changes``, signed with the user's key as evaluate signs one
    (components.serving.signed: the figures, the model files scored and the run, beside metrics.json)."""
    from components import provenance

    monkeypatch.setenv("LLMPACK_SIGNING_KEY_FILE", str(store["key"]))
    metrics = {**json.loads((store["eval"] / "metrics.json").read_text()), **changes}
    bound = {"model_files": json.loads((store["eval"] / SIGNATURE_FILE).read_text())["model_files"],
             "pipeline_run": pipeline_run}
    out = tmp_path / "metrics"
    out.mkdir(parents=True)
    (out / "metrics.json").write_text(json.dumps(metrics))
    seal = {**bound, "signature": provenance.sign("evaluation", {"metrics": metrics, **bound})}
    (out / SIGNATURE_FILE).write_text(json.dumps(seal))
    return out


def test_a_hand_written_or_edited_metrics_json_registers_nothing(store: dict[str, Any], tmp_path: Path) -> None:
    before, champion = _versions(store), _champion(store)
    eval_set = _client(store).get_model_version(NAME, champion).tags["llmpack.eval_set"]  # public, as the attack
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "metrics.json").write_text(json.dumps({"eval_loss": 0.0001, "eval_set": eval_set}))
    r = _register(tmp_path, store["model"], forged, store["uri"], store["key"], "pr-forged")
    _refused(r, store, before, champion, "metrics.json: not signed by this environment's key")
    edited = tmp_path / "edited"
    shutil.copytree(store["eval"], edited)  # the genuine signature beside an edited figure
    genuine = json.loads((store["eval"] / "metrics.json").read_text())
    (edited / "metrics.json").write_text(json.dumps({**genuine, "eval_loss": genuine["eval_loss"] / 2}))
    r = _register(tmp_path, store["model"], edited, store["uri"], store["key"], "pr-edited")
    _refused(r, store, before, champion, "metrics.json: not signed by this environment's key")


def test_a_signed_evaluation_of_other_files_or_another_run_registers_nothing(
        store: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before, champion = _versions(store), _champion(store)
    other = tmp_path / "other-model"
    shutil.copytree(store["model"], other)
    weights = other / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\1")
    r = _register(tmp_path, other, store["eval"], store["uri"], store["key"], "pr-other-files")
    _refused(r, store, before, champion, "adapter_model.safetensors: not the file that was sealed")  # by the seal
    # another model finetune sealed with the user's key, beside the evaluation of the first: the evaluation's refusal
    from components.serving.sealed import MODEL, sealed_output

    monkeypatch.setenv("LLMPACK_SIGNING_KEY_FILE", str(store["key"]))
    resealed = tmp_path / "resealed"
    with sealed_output(resealed, MODEL, "", weights="adapter", meta="llmpack-model.json") as private:
        shutil.copytree(other / "adapter", private / "adapter")
        shutil.copy(other / "llmpack-model.json", private / "llmpack-model.json")
    r = _register(tmp_path, resealed, store["eval"], store["uri"], store["key"], "pr-other-files")
    _refused(r, store, before, champion,
             "the evaluation scored other model files (adapter/adapter_model.safetensors differ)")
    elsewhere = _signed_metrics(store, tmp_path, monkeypatch, pipeline_run="pr-elsewhere")
    r = _register(tmp_path, store["model"], elsewhere, store["uri"], store["key"], "pr-here")
    _refused(r, store, before, champion, "the evaluation is of pipeline run 'pr-elsewhere', not 'pr-here'")


@pytest.mark.slow  # registers a version (two): ~30 s each on a quiet machine
def test_the_gate_is_recomputed_from_signed_figures_never_a_passed_field(
        store: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    champion = _champion(store)
    genuine = json.loads((store["eval"] / "metrics.json").read_text())
    # better than the champion on its own eval set, but the gate it was run with failed: passed says otherwise
    metrics = _signed_metrics(store, tmp_path, monkeypatch, eval_loss=genuine["eval_loss"] - 0.01,
                              min_improvement=100.0, passed=True)
    r = _register(tmp_path, store["model"], metrics, store["uri"], store["key"], "pr-gate")
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "reg-pr-gate" / "registration.json").read_text())
    assert record["promotion"] == f"version {record['version']} stays challenger (quality gate failed)"
    assert _champion(store) == champion


@pytest.mark.slow  # registers a version (two): ~30 s each on a quiet machine
def test_promotion_compares_the_champion_s_signed_figures_not_its_tags(
        store: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mc = _client(store)
    champion = _champion(store)
    signed_loss = json.loads(mc.get_model_version(NAME, champion).tags[PAYLOAD_TAG])["figures"]["eval_loss"]
    # someone with write access to the registry makes the champion unbeatable by its public tag
    mc.set_model_version_tag(NAME, champion, "llmpack.metric.eval_loss", "0.0")
    better = _signed_metrics(store, tmp_path / "a", monkeypatch, eval_loss=signed_loss - 0.01)
    r = _register(tmp_path, store["model"], better, store["uri"], store["key"], "pr-better")
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "reg-pr-better" / "registration.json").read_text())
    assert record["champion"] and f"beat v{champion}: " in record["promotion"], record["promotion"]
    assert record["promotion"] == (f"version {record['version']} -> champion "
                                   f"(beat v{champion}: {signed_loss - 0.01:.6g} < {signed_loss:.6g})")
    # ... and a champion whose signed payload was edited is not compared at all
    new = record["version"]
    tags = mc.get_model_version(NAME, new).tags
    mc.set_model_version_tag(NAME, new, PAYLOAD_TAG, tags[PAYLOAD_TAG].replace('"eval_loss":', '"eval_loss":1e-9,"x":'))
    best = _signed_metrics(store, tmp_path / "b", monkeypatch, eval_loss=signed_loss - 0.5)
    r = _register(tmp_path, store["model"], best, store["uri"], store["key"], "pr-best")
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "reg-pr-best" / "registration.json").read_text())
    assert not record["champion"] and _champion(store) == new
    assert f"(not compared: v{new}'s figures are not signed (its provenance signature does not verify" in \
        record["promotion"]


@pytest.mark.slow  # a register or verify process of its own: the slow tier
def test_an_experiment_made_with_a_strangers_artifact_location_gets_no_credentials(
        store: dict[str, Any], finetuned: Path, tmp_path: Path) -> None:
    """Round 6 (B1): a stranger made the ``llmpack`` experiment before the user's first run, with its artifact
    location on a listener of theirs; register sent the model and ``Authorization`` there. Refused in one line."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'planted.db'}"
    MlflowClient(uri).create_experiment("llmpack", artifact_location="http://127.0.0.1:9/steal")
    env = {**_env(store["key"], uri), "MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "pw-9f3e2"}
    out = tmp_path / "reg"
    r = run_step(REG, f"--input=model={finetuned}", f"--input=metrics={store['eval']}", f"--output=registration={out}",
                 f"--param=model_name={NAME}-planted", "--param=pipeline_run=pr-first", "--param=run_group=rg-prov",
                 cwd=tmp_path, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "an artifact location on another host than the tracking server's" in r.stderr, r.stderr[-2000:]
    assert "pw-9f3e2" not in r.stderr and not (out / "registration.json").exists()


@pytest.mark.slow  # a register or verify process of its own: the slow tier
def test_the_checked_copy_is_refused_in_a_directory_another_user_may_rename_in(store: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    """Round 6 (B4): a checked copy in a directory writable by others (no sticky bit) could be swapped for the
    stranger's files between the check and ``mlflow models serve``."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by others, not sticky
    env = _env(store["key"], store["uri"])
    cli = [sys.executable, "-m", "components.serving.verify", f"models:/{NAME}/1", str(shared / "copy")]
    r = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "another user may rename what is in it" in r.stderr, r.stderr[-2000:]
    assert not (shared / "copy").exists()


@pytest.mark.slow  # a register or verify process of its own: the slow tier
def test_champion_is_trusted_only_as_the_users_key_promoted_it(store: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """Round 8 (C3): the alias is anyone's to move (one request): ``@champion`` moved to an older version, or to
    one registered with ``--no-promote``, was loaded. The promotion is now a signed record on the registered
    model; an alias that disagrees with it, or a record edited, is refused."""
    from mlflow.tracking import MlflowClient

    from components.serving.signed import CHAMPION_TAG, UntrustedModel, verified_champion
    from components.serving.verify import fetch_verified

    monkeypatch.setenv("LLMPACK_SIGNING_KEY_FILE", str(store["key"]))
    mc = MlflowClient(store["uri"])
    tags = dict(mc.get_registered_model(NAME).tags)
    champion = mc.get_model_version_by_alias(NAME, "champion").version
    run_id = mc.get_model_version(NAME, champion).run_id
    verified_champion("m", name=NAME, version=champion, run_id=run_id, model_tags=tags)  # as promoted
    with pytest.raises(UntrustedModel, match="made version .* champion"):
        verified_champion("m", name=NAME, version=str(int(champion) + 1), run_id=run_id, model_tags=tags)  # moved
    mc.set_registered_model_tag(NAME, CHAMPION_TAG, tags[CHAMPION_TAG].replace(f'"{champion}"', '"99"'))
    try:
        with pytest.raises(UntrustedModel, match="no promotion signed with this environment's key"):
            fetch_verified(f"models:/{NAME}@champion", tmp_path / "copy", tracking_uri=store["uri"])
    finally:
        mc.set_registered_model_tag(NAME, CHAMPION_TAG, tags[CHAMPION_TAG])


@pytest.mark.slow  # the store of a register process of its own: the slow tier
def test_promote_by_hand_writes_the_signed_record_the_loader_trusts(store: dict[str, Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/serving.md's hand promotion: the alias moved with MLflow's client alone is refused by the loader
    (round 8); ``python -m components.serving.promote NAME VERSION`` writes the record with it (round 9: bound
    to the version's run)."""
    import json as _json

    from components.errors import InputError
    from components.serving.promote import promote
    from components.serving.signed import CHAMPION_TAG

    monkeypatch.setenv("LLMPACK_SIGNING_KEY_FILE", str(store["key"]))
    mc = _client(store)
    promote(NAME, "1", tracking_uri=store["uri"])
    record = _json.loads(mc.get_registered_model(NAME).tags[CHAMPION_TAG])
    assert record["version"] == "1" and record["run_id"] == mc.get_model_version(NAME, "1").run_id
    assert str(mc.get_model_version_by_alias(NAME, "champion").version) == "1"
    with pytest.raises(InputError, match="no such version"):
        promote(NAME, "7", tracking_uri=store["uri"])
    with pytest.raises(InputError, match="a registered version number"):
        promote(NAME, "../1", tracking_uri=store["uri"])
