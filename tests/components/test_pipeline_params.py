"""Every step parameter a user may need is a pipeline parameter, on every compiled path."""

from __future__ import annotations

import pytest
import yaml

from components.dsl import PipelineParamRef
from components.finetune_pipeline import build
from llmpack.run.user_pipeline import parse_params
from tests.conftest import REPO


def test_every_step_parameter_is_wired_to_a_pipeline_parameter() -> None:
    pipe = build()
    for task in pipe.tasks.values():
        for name in task.step.params:
            arg = task.arguments.get(name)
            assert isinstance(arg, PipelineParamRef), (
                f"{task.name}.{name} is fixed at its step default; make it a pipeline parameter")
            assert arg.name in pipe.params


def _compiled_params() -> dict[str, set[str]]:
    kfp = next(yaml.safe_load_all((REPO / "kfp_pipelines" / "finetune.yaml").read_text()))
    argo = yaml.safe_load((REPO / "argo_workflows" / "finetune.yaml").read_text())
    out = {
        "kfp": set(kfp["root"]["inputDefinitions"]["parameters"]),
        "argo": {p["name"] for p in argo["spec"]["arguments"]["parameters"]},
    }
    for project in ("finetune", "finetune-k8s"):
        doc = yaml.safe_load((REPO / "mlflow_projects" / project / "MLproject").read_text())
        out[f"mlflow/{project}"] = set(doc["entry_points"]["main"]["parameters"])
    return out


def test_skip_bad_rows_and_friends_are_parameters_of_every_committed_artifact() -> None:
    wanted = set(build().params)
    assert {"skip_bad_rows", "eval_fraction", "grad_accum", "lora_r", "eval_batch_size"} <= wanted
    for path, params in _compiled_params().items():
        assert wanted <= params, (path, sorted(wanted - params))


def test_skip_bad_rows_is_settable_from_the_cli() -> None:
    assert parse_params(("skip_bad_rows=true", "lora_r=8")) == {"skip_bad_rows": True, "lora_r": 8}


@pytest.mark.parametrize(("params", "expect"), [
    ({"lr": -1}, "parameter lr: -1.0 is not allowed; must be a finite number > 0"),
    ({"max_steps": 0}, "parameter max_steps: 0 is not allowed; must be a positive number of steps"),
    ({"max_steps": "abc"}, "parameter max_steps: 'abc' is not a valid int"),
    ({"nope": 1}, "parameter 'nope': unknown pipeline parameter"),
])
def test_a_library_submit_goes_through_the_one_parameter_gate(params: dict, expect: str):
    """kfp_pipelines.submit.submit(params=...) and the other submitters call user_parameters -> Pipeline.bind."""
    from components.errors import InputError
    from components.finetune_pipeline import build
    from components.servers.submission import user_parameters

    with pytest.raises(InputError) as err:
        user_parameters(build(), params)
    assert str(err.value).startswith(expect)


def test_bind_coerces_and_keeps_typed_values():
    from components.finetune_pipeline import build

    assert build().bind({"lr": 1, "max_steps": "7", "skip_bad_rows": "yes", "model": None}) == {
        "lr": 1.0, "max_steps": 7, "skip_bad_rows": True}
