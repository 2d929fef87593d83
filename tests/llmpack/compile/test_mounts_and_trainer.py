"""Compile refuses what the API server would refuse later: two volumes at one mount path, and a TrainJob
field the Trainer release compiled for does not have. One line naming the flags, exit 2, nothing written.

The real API server's refusals behind them are shown in tests/realcluster/test_production_shape.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from components.errors import InputError
from llmpack.compile.artifacts import check_cache_mount, check_trainer_version
from llmpack.compile.pod_options import CheckpointOptions, PodOptions


@pytest.mark.parametrize(("flags", "words"), [
    ({"model_pvc": "m:/dev/shm"}, ("--model-pvc 'm:/dev/shm'", "shared memory", "--gpus")),
    ({"model_pvc": "m:/tmp"}, ("--model-pvc 'm:/tmp'", "scratch directory")),
    ({"data_pvc": "d:/dev/shm/x"}, ("--data-pvc", "/dev")),
])
def test_a_claim_at_the_packs_own_mount_is_one_line(flags: dict[str, str], words: tuple[str, ...]) -> None:
    with pytest.raises(InputError) as refused:
        PodOptions.from_flags(**flags)
    assert all(w in str(refused.value) for w in words) and "\n" not in str(refused.value), refused.value


@pytest.mark.parametrize("flag", ["model_pvc", "data_pvc"])
def test_a_claim_at_the_hf_cache_with_cache_pvc_names_both_flags(flag: str) -> None:
    pod = PodOptions.from_flags(**{flag: "m:/var/cache/llmpack/huggingface"})
    check_cache_mount(pod, None)  # no --cache-pvc: nothing else mounts there
    with pytest.raises(InputError) as refused:
        check_cache_mount(pod, "shared")
    text = str(refused.value)
    assert f"--{flag.replace('_', '-')}" in text and "--cache-pvc shared" in text and "\n" not in text


def test_a_checkpoint_pvc_at_the_hf_cache_too() -> None:
    pod = PodOptions.from_flags(
        checkpoints=CheckpointOptions.from_flags(checkpoint_pvc="c:/var/cache/llmpack/huggingface"))
    with pytest.raises(InputError, match="--checkpoint-pvc c:/var/cache/llmpack/huggingface with --cache-pvc s"):
        check_cache_mount(pod, "s")


def test_trainer_22_refuses_a_grace_period_only_with_a_trainjob() -> None:
    ckpt = CheckpointOptions.from_flags(checkpoint_pvc="ckpt")
    v22 = PodOptions.from_flags(checkpoints=ckpt, trainer_version="2.2")
    check_trainer_version(v22, 1)  # no TrainJob: nothing to refuse
    check_trainer_version(PodOptions.from_flags(checkpoints=ckpt, trainer_version="2.3"), 2)
    check_trainer_version(PodOptions.from_flags(trainer_version="2.2"), 2)  # no grace period: v2.2 takes it
    for pod in (v22,
                PodOptions.from_flags(checkpoints=CheckpointOptions.from_flags(grace_period=60),
                                      trainer_version="2.2")):
        with pytest.raises(InputError,
                           match="--trainer-version 2.2: its TrainJob has no terminationGracePeriodSeconds"):
            check_trainer_version(pod, 2)


def test_compile_refuses_before_writing(tmp_path: Path) -> None:
    from llmpack.compile.artifacts import compile_all

    pod = PodOptions.from_flags(model_pvc="m:/var/cache/llmpack/huggingface")
    with pytest.raises(InputError, match="--cache-pvc shared"):
        compile_all(tmp_path / "out", cache_pvc="shared", pod=pod)
    assert not (tmp_path / "out").exists()


def test_doctor_installs_the_release_compiled_for() -> None:
    from components.trainjob.spec import DEFAULT_TRAINER, TRAINER_RELEASES
    from llmpack.cluster.doctor.gang import trainer_install

    assert DEFAULT_TRAINER == "2.3" and "ref=v2.3.0'" in trainer_install()
    assert "ref=v2.2.0'" in trainer_install("2.2") and TRAINER_RELEASES["2.2"] == "v2.2.0"


def test_a_checkpoint_volume_checkpoints_by_time_by_default() -> None:
    """An OOM kill or a lost node gives no SIGTERM: with a volume, finetune also checkpoints every 10 minutes,
    less often when a measured write is slow (at most a tenth of the time), and as told when told."""
    assert CheckpointOptions.from_flags(checkpoint_pvc="c").minutes == 10
    assert CheckpointOptions.from_flags(checkpoint_pvc="c", checkpoint_save_s=120).minutes == 20
    assert CheckpointOptions.from_flags(checkpoint_pvc="c", checkpoint_minutes=3).minutes == 3
    assert CheckpointOptions.from_flags().minutes is None  # no volume: nothing would survive a kill anyway


def test_compile_states_the_checkpoint_policy(tmp_path: Path) -> None:
    from llmpack.compile.artifacts import checkpoint_note

    note = checkpoint_note(PodOptions.from_flags(checkpoints=CheckpointOptions.from_flags(checkpoint_pvc="ckpt")))
    assert note is not None and "every 10 min" in note and "on SIGTERM" in note and "\n" not in note
