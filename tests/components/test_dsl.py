"""The authoring model: steps from typed functions, the pipeline DAG and its validation."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from components.dsl import (
    Dataset,
    Execution,
    Input,
    Metrics,
    Model,
    Output,
    Resources,
    is_dns1123_label,
    pipeline,
    step,
)
from components.errors import PipelineValidationError
from components.finetune_pipeline import build


@step()
def make_data(out: Output[Dataset], n: int = 3) -> None:
    """Make some data."""


@step()
def train(data: Input[Dataset], model: Output[Model], lr: float = 0.1, name: str = "x") -> None:
    """Train."""


@step()
def score(model: Input[Model], metrics: Output[Metrics]) -> None:
    """Score."""


def test_step_reads_its_typed_signature() -> None:
    assert train.name == "train"
    assert set(train.params) == {"lr", "name"}
    assert train.params["lr"].type is float and train.params["lr"].default == 0.1
    assert train.inputs == {"data": Dataset}
    assert train.outputs == {"model": Model}
    assert train.ref == f"{__name__}:train"


def test_pipeline_wires_a_dag_in_order() -> None:
    @pipeline(name="toy")
    def toy(lr: float = 0.5) -> None:
        d = make_data()
        t = train(data=d.outputs["out"], lr=lr)
        score(model=t.outputs["model"])

    pipe = toy()
    assert [t.name for t in pipe.task_order()] == ["make-data", "train", "score"]
    assert "submitted_at" in pipe.all_params and "pipeline_run" in pipe.all_params


def test_the_finetune_pipeline_has_five_steps() -> None:
    pipe = build()
    assert [t.name for t in pipe.task_order()] == ["prepare-data", "tokenize", "finetune", "evaluate", "register"]
    assert pipe.tasks["finetune"].step.execution.resources.gpus == 1


def test_cycle_is_named() -> None:
    @pipeline(name="cyclic")
    def cyclic() -> None:
        d = make_data()
        t = train(data=d.outputs["out"])
        d.after(t)

    with pytest.raises(PipelineValidationError,
                       match=r"cycle .*make-data -> train -> make-data|cycle .*train -> make-data -> train"):
        cyclic()


def test_missing_input_is_named() -> None:
    @pipeline(name="missing")
    def missing() -> None:
        train()

    with pytest.raises(PipelineValidationError, match="task 'train': input 'data' is not connected"):
        missing()


def test_a_pipeline_named_like_one_of_its_steps_is_refused() -> None:
    """KFP's compiled spec took the step `make-data` for a pipeline also named `make-data` (the newcomer's trial:
    `TypeError: word-counts() got an unexpected keyword argument`); every path refuses it at once."""
    @pipeline(name="make-data")
    def same() -> None:
        make_data()

    with pytest.raises(PipelineValidationError, match="pipeline 'make-data': a step of it has the same name"):
        same()


def test_type_mismatch_of_artifacts_is_named() -> None:
    @pipeline(name="mismatch")
    def mismatch() -> None:
        d = make_data()
        score(model=d.outputs["out"])

    with pytest.raises(PipelineValidationError, match="input 'model' wants Model, but make-data.out is Dataset"):
        mismatch()


def test_type_mismatch_of_parameters_is_named() -> None:
    @pipeline(name="badparam")
    def badparam(name: int = 1) -> None:
        d = make_data()
        train(data=d.outputs["out"], name=name)

    with pytest.raises(PipelineValidationError, match="parameter 'name' is str, but pipeline parameter 'name' is int"):
        badparam()

    @pipeline(name="badconst")
    def badconst() -> None:
        make_data(n="three")

    with pytest.raises(PipelineValidationError, match="parameter 'n' is int, got str"):
        badconst()


def test_unknown_parameter_is_named() -> None:
    @pipeline(name="unknown")
    def unknown() -> None:
        make_data(nope=1)

    with pytest.raises(PipelineValidationError, match="has no parameter 'nope'"):
        unknown()


@pytest.mark.parametrize("name", ["Bad_Name", "-x", "x" * 64, "a.b", "", "abc\n"])
def test_invalid_dns1123_names(name: str) -> None:
    assert not is_dns1123_label(name)
    with pytest.raises(PipelineValidationError, match="not a valid DNS-1123 label"):
        pipeline(name=name)(lambda: None)()


def test_invalid_step_name_is_named() -> None:
    bad = step(name="Has_Upper")(make_data.func)

    @pipeline(name="badstep")
    def badstep() -> None:
        bad()

    with pytest.raises(PipelineValidationError, match="task 'Has_Upper': name is not a valid DNS-1123 label"):
        badstep()


def _with_resources(res: Resources):
    gpu = replace(train, execution=Execution(resources=res))

    @pipeline(name="gpus")
    def gpus() -> None:
        d = make_data()
        gpu(data=d.outputs["out"])

    return gpus


def test_negative_gpu_count_is_named() -> None:
    with pytest.raises(PipelineValidationError, match="resources.gpus is -1; must be >= 0"):
        _with_resources(Resources(gpus=-1, gpu_type="nvidia-l4"))()


def test_gpu_type_with_zero_gpus_is_named() -> None:
    with pytest.raises(PipelineValidationError, match="gpu_type is 'nvidia-l4' but resources.gpus is 0"):
        _with_resources(Resources(gpus=0, gpu_type="nvidia-l4"))()


def test_unsupported_parameter_type_is_rejected() -> None:
    with pytest.raises(PipelineValidationError, match="parameter 'x' has type"):

        @step()
        def bad(out: Output[Dataset], x: list = None) -> None:  # type: ignore[assignment]
            pass


def test_calling_a_step_outside_a_pipeline_is_an_error() -> None:
    with pytest.raises(PipelineValidationError, match="inside a @pipeline"):
        make_data()


def test_import_components_is_light() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import components, components.finetune_pipeline; "
        "dt = time.perf_counter() - t; "
        "heavy = [m for m in ('torch','transformers','peft','mlflow','kfp','hera','kubernetes','numpy') "
        "if m in sys.modules]; "
        "print(heavy); print(dt)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", f"heavy modules imported by `import components`: {out[0]}"


def test_a_step_called_twice_is_one_line_not_a_record_that_loses_a_task() -> None:
    """Trial 8: a step used twice ran as `count-rows` and `count-rows-2`, but the record keys events and metrics by
    the step's name: the second use's metrics were filed under the first, the first's lost."""
    import pytest as _pytest

    from components.dsl import pipeline, step
    from components.errors import PipelineValidationError

    @step(name="count-rows-t8")
    def count(out: Output[Dataset], min_len: int = 0) -> None:
        """Count."""

    @pipeline(name="twice-t8")
    def twice() -> None:
        count()
        count(min_len=20)

    with _pytest.raises(PipelineValidationError, match=r"^step 'count-rows-t8' is called twice in the pipeline"):
        twice()
