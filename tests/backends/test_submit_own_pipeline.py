"""Issue 52: ``cluster submit kfp --package`` / ``argo --workflow`` of a pipeline of one's own checked its
``--param`` against the shipped pipeline (``unit``: unknown). A compiled file of one's own is now checked
against the parameters it declares, typed as it declares them."""

from __future__ import annotations

import pytest

from components.errors import InputError
from components.servers.submission import declared_values

KFP = {"data": str, "seed": int, "unit": str, "top": int, "rate": float, "loud": bool, "pipeline_run": str}


def test_values_take_the_compiled_files_own_names_and_types() -> None:
    got = declared_values({"unit": "words", "top": "5", "rate": "0.5", "loud": "true"}, KFP, "--package p.yaml")
    assert got == {"unit": "words", "top": 5, "rate": 0.5, "loud": True}


@pytest.mark.parametrize(("params", "message"), [
    ({"uint": "x"}, "--package p.yaml: the compiled pipeline has no parameter 'uint'; did you mean 'unit'?"),
    ({"top": "many"}, "--package p.yaml: parameter 'top': 'many' is not a valid int"),
    ({"pipeline_run": "x"}, "parameter 'pipeline_run' is set by `llmpack cluster submit` (--run-group, "
                            "--pipeline-run), not by --param"),
])
def test_a_name_or_value_the_file_does_not_take_is_one_line(params: dict[str, str], message: str) -> None:
    with pytest.raises(InputError) as err:
        declared_values(params, KFP, "--package p.yaml")
    assert str(err.value).startswith(message), str(err.value)
    assert "pipeline_run" not in str(err.value).partition("(known:")[2]  # the user's own names only
