"""The third independent check's findings that are not about the sealed outputs (test_sealed_model.py has those).

Each failed before its fix: the outage hint printed a query or fragment token, a Python started with an
empty PYTHONPATH entry imported from the working directory, and `cluster timeline` printed escape bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from components.redaction import printable


@pytest.mark.parametrize("uri", [
    "http://127.0.0.1:9/?run=7#token=hunter2pass", "http://h/?a=1?token=hunter2pass", "http://h/?a=1,token=hunter2pass",
    "http://h/#a=1#pw=hunter2pass", "http://h/?accessToken=hunter2pass", "http://h/?authToken=hunter2pass",
    "http://h/?apiToken=hunter2pass", "http://h/?sessionid=hunter2pass", "http://h/?to%6Ben=hunter2pass",
    "http://u:hunter2pass@h:5000",
])
def test_the_outage_hint_names_the_store_without_its_secret(uri: str, monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    from llmpack.run.local import sync_hint

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    line = sync_hint(tmp_path / "run", uri)
    assert "--tracking-uri" in line and "hunter2pass" not in line, line
    assert "hunter2pass" not in printable(uri, 400)


def test_an_empty_pythonpath_entry_is_dropped_from_the_step_processes(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    from llmpack.run.user_pipeline import step_pythonpath

    monkeypatch.chdir(tmp_path)
    env = step_pythonpath(None, {"PYTHONPATH": ":/opt/x:", "HOME": "/h"})
    assert env["PYTHONPATH"] == "/opt/x"  # '' would be the working directory, even under -P
    assert "PYTHONPATH" not in step_pythonpath(None, {"PYTHONPATH": ":"})
    assert step_pythonpath("mine:pipe", {"PYTHONPATH": ":"})["PYTHONPATH"] == str(tmp_path)  # --pipeline: asked for


def test_cluster_timeline_prints_no_escape_byte_from_a_dump(tmp_path: Path) -> None:
    from llmpack.cluster.k8s.timeline import format_table

    evil = "\x1b]52;c;cHduZWQ=\x07\u202e\x9b31m"
    row = {"pod": "p" + evil, "orchestrator": "argo", "role": "step", "step": "finetune" + evil, "instance_type": None,
           "queue_s": 1.0, "provision_s": None, "image_pull_s": None, "start_s": 2.0, "run_s": 3.0,
           "phase": "Succeeded"}
    out = format_table([row])
    assert not any(not c.isprintable() for c in out.replace("\n", "")), repr(out)
    from components.errors import InputError
    from llmpack.cluster.k8s.dumps import load_dump

    (tmp_path / "pods.json").write_text(json.dumps({"kind": "Evil" + evil}))
    with pytest.raises(InputError) as err:
        load_dump(tmp_path / "pods.json")
    assert all(c.isprintable() for c in str(err.value)), repr(str(err.value))
    assert os.path.exists(tmp_path / "pods.json")


def test_many_planted_event_files_are_refused_together_not_each(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each event file was capped, their number was not: four planted 32 MiB files took sync to 432 MB."""
    from components.errors import InputError
    from components.record import telemetry

    monkeypatch.setattr(telemetry, "MAX_RECORDS_BYTES", 4096)
    for i in range(4):
        d = tmp_path / f"s{i}"
        d.mkdir()
        (d / telemetry.EVENTS_FILE).write_text("{}\n" * 600)  # 1,800 bytes each
    with pytest.raises(InputError, match="read together pass 10,000 files or 0 MiB in all"):
        telemetry.read_records_counted(telemetry.find_event_files(tmp_path))


def test_the_one_error_line_never_carries_an_escape_byte(capsys: pytest.CaptureFixture[str]) -> None:
    """The fourth check: a dump's metadata.name with OSC 52, C1 CSI and U+202E reached the terminal through the
    error line (object_label quotes it raw); the one printer now shows them as '?'."""
    from llmpack.cli import fail

    with pytest.raises(SystemExit) as code:
        fail("pods.json: items[0] pod 'x\x1b]52;c;cHduZWQ=\x07\u202e\x9b31m': no spec")
    err = capsys.readouterr().err
    assert code.value.code == 2 and err.startswith("llmpack: error: pods.json: items[0] pod 'x?]52;c;")
    assert all(c.isprintable() for c in err.rstrip("\n")), repr(err)


@pytest.mark.parametrize("key", ["token2", "password_", "access_token_v2", "db.pass", "api.key", "x.pw", "api%20key",
                                 "token[0]", "to%256Ben"])
def test_a_query_key_with_a_credential_word_in_it_is_blanked(key: str) -> None:
    assert "hunter22x" not in printable(f"http://h/?{key}=hunter22x&z=1", 400)


def test_the_seeds_interval_is_never_narrower_than_student_t() -> None:
    """The outcome check: above 30 degrees of freedom the table fell back to 2.0, narrower than t(31) = 2.0395."""
    from scipy import stats

    from components.serving.spread import t975

    for df in range(1, 200):
        assert t975(df) >= stats.t.ppf(0.975, df) - 5e-4, df


# --------------------------------------------------------------------------- the fifth check


def test_an_output_directory_swapped_for_a_link_is_refused_before_anything_is_cleared(tmp_path: Path) -> None:
    from components.errors import InputError
    from components.serving import sealed

    victim = tmp_path / "victim"
    (victim / "adapter").mkdir(parents=True)
    (victim / "adapter" / "keep.txt").write_text("mine")
    (victim / "llmpack-model.json").write_text("mine")
    out = tmp_path / "model"
    out.symlink_to(victim)  # the step's output, swapped for a link while it trained
    with pytest.raises(InputError, match="a symlink is refused"):
        with sealed.sealed_output(out, sealed.MODEL, "", weights="adapter", meta="llmpack-model.json") as private:
            (private / "adapter").mkdir()
            (private / "adapter" / "w.bin").write_bytes(b"w")
            (private / "llmpack-model.json").write_text("{}")
    assert (victim / "adapter" / "keep.txt").read_text() == "mine" and (victim / "llmpack-model.json").exists()


def test_files_a_step_appends_or_replaces_are_never_written_through_a_planted_link(tmp_path: Path) -> None:
    from components import bounded
    from components.errors import InputError
    from components.training.progress import ProgressFile

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "train_log.jsonl").symlink_to(victim)
    with pytest.raises(InputError, match="a symlink is refused"):
        bounded.open_append(tmp_path / "train_log.jsonl")
    (tmp_path / ".llmpack-progress.json.tmp").symlink_to(victim)  # the old predictable temporary name
    ProgressFile(tmp_path / "llmpack-progress.json", start_step=0, max_steps=10)
    assert victim.read_text() == "mine" and json.loads((tmp_path / "llmpack-progress.json").read_text())["step"] == 0


def test_the_client_log_is_never_appended_through_a_planted_link(tmp_path: Path) -> None:
    from components.errors import InputError
    from llmpack.ui.display import _LazyFileHandler

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "llmpack-client.log").symlink_to(victim)
    handler = _LazyFileHandler(tmp_path / "llmpack-client.log")  # the handler alone: no global logging state touched
    with pytest.raises(InputError, match="a symlink is refused"):
        handler._open()
    assert victim.read_text() == "mine"


def test_a_store_file_name_and_a_planted_run_name_print_no_escape_byte() -> None:
    from components.serving.signed import UntrustedModel
    from components.serving.verify import check_listing

    evil = "x\x1b]52;c;cHduZWQ=\x07\x1b[2J\u202e.bin"
    with pytest.raises(UntrustedModel) as err:
        check_listing("models:/m/1", {evil: 1}, {})
    assert all(c.isprintable() for c in str(err.value)), repr(str(err.value))


def test_an_output_directory_swapped_for_a_link_is_never_written_through(tmp_path: Path) -> None:
    """Round 5: a step whose output directory was swapped for a symlink wrote its progress file, train log and
    events into the link's target. The writers open the directory first (O_NOFOLLOW) and refuse a link."""
    from components import bounded
    from components.errors import InputError
    from components.record.telemetry import EventLog, Record

    target, out = tmp_path / "elsewhere", tmp_path / "out"
    target.mkdir()
    out.mkdir()
    log = EventLog(out / "events.jsonl")
    out.rmdir()
    out.symlink_to(target)  # swapped after the step opened its output
    with pytest.raises(InputError, match="a symlink is refused"):
        bounded.write_atomic(out / "llmpack-progress.json", b"{}")
    with pytest.raises(InputError, match="a symlink is refused"):
        bounded.open_append(out / "train_log.jsonl")
    with pytest.raises(InputError, match="a symlink is refused"):
        log.append(Record(key="k", kind="event", step="s", name="started", value=1.0, run_group="g", pipeline_run="r",
                          orchestrator="direct", mode="local"))
    assert list(target.iterdir()) == []
    bounded.write_atomic(target / "fine.json", b"{}")  # a real directory still takes the file
    assert (target / "fine.json").read_bytes() == b"{}"


@pytest.mark.parametrize("text", [
    "--from-literal=signing-key=5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e", '"signing-key":"5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e"',
    "private-key=5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e", "secret-key=5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e",
    "access-key=5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e", "client-secret=5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e",
])
def test_a_hyphenated_key_name_is_redacted_as_its_underscored_one(text: str) -> None:
    """The tracking Secret's own key is ``signing-key``: ``signing_?key`` let its value through."""
    from components.redaction import redact_text

    assert "5e5e5e5e" not in redact_text(text, set()), redact_text(text, set())


def test_doctors_fix_line_keeps_its_command_substitution() -> None:
    from components.redaction import redact_text

    fix = '--from-literal=signing-key="$(openssl rand -hex 32)"'
    assert redact_text(fix, set()) == fix


@pytest.mark.parametrize("text", [
    "password: hunter2pass9", "  signing-key: 5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e", "--password hunter2pass9",
    "--signing-key 5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e", 'api-token: "Zq8xK2mVb7Lp4Rt9"',
])
def test_yaml_and_flag_shaped_secrets_are_redacted(text: str) -> None:
    """Round 6 (B6): ``password: X`` and ``--password X`` printed X whole."""
    from components.redaction import redact_text

    out = redact_text(text, set())
    assert "hunter2" not in out and "5e5e5e5e" not in out and "Zq8xK2" not in out, out


@pytest.mark.parametrize("text", ["token: not set", "the --password flag is refused",
                                  "--tracking-secret llmpack-mlflow", "--hf-token-secret hf-token"])
def test_words_after_a_secret_name_stay_readable(text: str) -> None:
    from components.redaction import redact_text

    assert redact_text(text, set()) == text


def test_a_directory_on_the_way_to_the_output_swapped_for_a_link_is_refused(tmp_path: Path) -> None:
    """Round 6 (B2): the output's parent (``VOL/run``) swapped for a link to the user's files mid-step: the seal
    cleared and wrote the victim's ``model/`` through it. The step's directories are pinned by device and inode."""
    from components import bounded
    from components.errors import InputError
    from components.serving.sealed import MODEL, sealed_output

    run, victim = tmp_path / "vol" / "run", tmp_path / "victim"
    (run / "model").mkdir(parents=True)
    (victim / "model" / "adapter").mkdir(parents=True)
    (victim / "model" / "adapter" / "notes.txt").write_text("mine")
    with bounded.pinned_directories([run / "model"]):
        run.rename(tmp_path / "vol" / "run.moved")
        run.symlink_to(victim)  # the parent, not the output itself
        with pytest.raises(InputError, match="not the directory the step began with"):
            bounded.write_atomic(run / "model" / "llmpack-progress.json", b"{}")
        with pytest.raises(InputError, match="not the directory the step began with"):
            with sealed_output(run / "model", MODEL, "", weights="adapter", meta="m.json") as private:
                (private / "adapter").mkdir()
                (private / "adapter" / "w.bin").write_bytes(b"w")
                (private / "m.json").write_text("{}")
    assert (victim / "model" / "adapter" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (victim / "model").iterdir()) == ["adapter"]


def test_a_file_where_a_directory_was_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Round 6 (B5): ``model/adapter`` replaced by a file gave NotADirectoryError's traceback."""
    from components import bounded
    from components.errors import InputError

    (tmp_path / "adapter").write_text("a file now")
    with pytest.raises(InputError, match="not a regular file"):
        bounded.open_regular(tmp_path / "adapter" / "README.md")


@pytest.mark.parametrize("uri", [
    "http://127.0.0.2:5056\\@127.0.0.1:5055/stolen", "mlflow-artifacts://127.0.0.2:5058\\@127.0.0.1:5055/x",
    "http://127.0.0.1:+5055/x", "http://127.0.0.1:abc/x", "ftp://127.0.0.1:5055/x", "sftp://evil/x", "hdfs://nn/x",
    "http://evil:5055/x", "http://127.0.0.1:5056/x",
])
def test_round7_artifact_locations_a_stranger_spells_are_refused(uri: str) -> None:
    """Round 7 (B1): urlsplit read ``STRANGER\\@TRACKING`` as TRACKING's host, urllib3 connected to STRANGER."""
    from components.record.tracking import artifact_uri_problem

    assert artifact_uri_problem(uri, "http://127.0.0.1:5055") is not None


@pytest.mark.parametrize("uri", ["mlflow-artifacts:/1/abc/artifacts", "http://127.0.0.1:5055/api/2.0/x",
                                 "s3://bucket/1/x"])
def test_the_servers_own_and_object_store_locations_are_taken(uri: str) -> None:
    from components.record.tracking import artifact_uri_problem

    assert artifact_uri_problem(uri, "http://127.0.0.1:5055") is None


@pytest.mark.parametrize("uri", ["file:///home/J D/mlruns/1", "/tmp/drop/1/artifacts"])
def test_a_path_is_taken_from_a_local_store_never_from_a_remote_one(uri: str) -> None:
    """Round 8 (C1): a stranger made the experiment on a shared server with ``artifact_location=/tmp/drop``:
    the model was written on the user's machine into the stranger's directory (and through a link planted
    there, over the user's ``.bashrc``)."""
    from components.record.tracking import artifact_uri_problem

    assert artifact_uri_problem(uri, "sqlite:////home/u/mlflow.db") is None
    assert "a local path named by a remote tracking server" in str(artifact_uri_problem(uri, "http://h:5000"))


def test_a_run_directory_swapped_before_the_step_began_is_refused_and_fd_checks_close_the_race(tmp_path: Path) -> None:
    """Round 7 (B2): ``run/finetune`` swapped for a link before finetune's process began was pinned as it was;
    and a swap between the pin check and the open won 6-9% of a flipper's races. The three levels the
    orchestrator made must be real directories, and what is written is checked on the descriptor opened."""
    import os

    from components import bounded
    from components.errors import InputError

    victim = tmp_path / "victim" / "model"
    victim.mkdir(parents=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "finetune").symlink_to(tmp_path / "victim")
    with pytest.raises(InputError, match="a symlink where the run's directory should be"):
        with bounded.pinned_directories([tmp_path / "run" / "finetune" / "model"], real_levels=3):
            pass
    out = tmp_path / "out"
    out.mkdir()
    with bounded.pinned_directories([out]):
        other = tmp_path / "other"
        other.mkdir()
        fd = os.open(other, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(InputError, match="not the directory the step began with"):
                bounded.check_pinned_fd(out, fd)  # what a swap won between check and open would have opened
        finally:
            os.close(fd)


def test_remove_scratch_removes_nothing_through_a_swapped_directory(tmp_path: Path) -> None:
    from components import bounded
    from components.training.checkpointing import remove_scratch

    out, victim = tmp_path / "vol" / "model", tmp_path / "victim"
    (out / "checkpoints").mkdir(parents=True)
    (victim / "model" / "checkpoints").mkdir(parents=True)
    (victim / "model" / "checkpoints" / "keep.txt").write_text("mine")
    with bounded.pinned_directories([out / "checkpoints"]):
        (tmp_path / "vol").rename(tmp_path / "vol.moved")
        (tmp_path / "vol").symlink_to(victim)
        remove_scratch(out / "checkpoints", out)
    assert (victim / "model" / "checkpoints" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("text", [
    "password: hunter2", "password: correcthorsebatterystaple", 'password: "hunter2 pass 99"',
    '--password "correct horse 42 battery"', "password:hunter2pass9", "pass: hunter2pass", "pw: hunter2pass",
    "secret_key: sesskey_9f8e7d6c",
])
def test_round7_secret_shapes_are_redacted(text: str) -> None:
    from components.redaction import redact_text

    out = redact_text(text, set())
    assert not any(w in out for w in ("hunter2", "correcthorse", "sesskey", "battery")), out


@pytest.mark.parametrize("text", ["--tracking-secret llmpack-mlflow-v2", "--hf-token-secret hf-token-2024",
                                  "KFP_TOKEN: missing in the environment"])
def test_a_secrets_name_after_its_flag_stays_readable(text: str) -> None:
    from components.redaction import redact_text

    assert redact_text(text, set()) == text


def test_removal_goes_through_descriptors_never_through_a_swapped_link(tmp_path: Path) -> None:
    """Round 8 (C2): ``remove_scratch`` checked the pin, then ``rmtree`` by path followed a link swapped in
    between (1.5% of a flipper's tries removed the victim's directory). Removal now opens each level by
    descriptor, checks it is the pinned one, and removes through it."""
    import os

    from components import bounded
    from components.training import checkpointing

    run, victim = tmp_path / "root" / "pr", tmp_path / "victim"
    (run / "finetune" / "step-00000001").mkdir(parents=True)
    (victim / "finetune").mkdir(parents=True)
    (victim / "finetune" / "keep.txt").write_text("mine")
    with bounded.pinned_directories([run / "finetune"]):
        parent_fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
        try:  # the swap lands after the parent is opened: the entry opened is not the pinned one
            (run / "finetune").rename(tmp_path / "moved")
            (victim / "finetune").rename(run / "finetune")
            checkpointing._remove_at(parent_fd, "finetune", expect=run / "finetune")
        except Exception:  # noqa: BLE001 - refused: what matters is what is left
            pass
        finally:
            os.close(parent_fd)
    assert (run / "finetune" / "keep.txt").read_text() == "mine"


def test_the_checked_copy_through_a_link_in_a_shared_directory_is_refused(tmp_path: Path) -> None:
    """Round 8 (C7): ``shared/served/champ`` with ``served`` a link to the user's own directory was taken (the
    rule looked at the resolved path); whoever may write ``shared`` repoints the link after the check."""
    from components.errors import InputError
    from components.serving.verify import _check_private

    shared, mine = tmp_path / "shared", tmp_path / "mine"
    shared.mkdir()
    shared.chmod(0o777)
    mine.mkdir(mode=0o700)
    (mine / "champ").mkdir(mode=0o700)
    (shared / "served").symlink_to(mine)
    with pytest.raises(InputError, match="another user may rename what is in it"):
        _check_private(shared / "served" / "champ")
    _check_private(mine / "champ")  # the same directory, by a path no one else controls
