"""``--pipeline MODULE:NAME``: the user's own pipeline (a ``@pipeline`` function or a ``Pipeline``) on every path.

The module is imported the way ``python -m`` would find it from the current directory (the
current directory first on ``sys.path``), and the step processes get the same directory on their
``PYTHONPATH`` (:func:`step_pythonpath`), so a step defined there imports in every process; the
MLflow project carries the module itself (:mod:`llmpack.compile`). The name is checked before
anything is imported: dotted Python identifiers, one colon, one identifier.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

from components.errors import InputError

PIPELINE_REF = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$", re.ASCII)
EXAMPLE = "examples.custom_step:with_report"


def check_ref(ref: str) -> tuple[str, str]:
    """``module.path:name`` -> (module, name), or one line naming the flag."""
    if not PIPELINE_REF.match(ref):
        raise InputError(f"--pipeline {ref[:80]!r}: expected MODULE:NAME (a @pipeline function or a Pipeline), "
                         f"e.g. {EXAMPLE}")
    module, name = ref.split(":")
    return module, name


def load_pipeline(ref: str | None) -> Any:
    """The pipeline ``ref`` names (None: the built-in fine-tuning pipeline), built and validated."""
    from components.dsl import Pipeline
    from components.finetune_pipeline import build

    if ref is None:
        return build()
    module_name, name = check_ref(ref)
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InputError(f"--pipeline {ref}: cannot import {module_name} ({exc}); run llmpack from the directory that "
                         "holds it, or add that directory to PYTHONPATH") from None
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed on import: one line naming it
        raise InputError(f"--pipeline {ref}: importing {module_name} failed ({type(exc).__name__}: {exc})") from None
    try:
        obj = getattr(module, name)
    except AttributeError:
        raise InputError(f"--pipeline {ref}: {module_name} has no {name}") from None
    if isinstance(obj, Pipeline):
        return obj.validate()
    if callable(obj):
        try:
            built = obj()
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's @pipeline failed to build: one line
            raise InputError(f"--pipeline {ref}: building it failed ({type(exc).__name__}: {exc})") from None
        if isinstance(built, Pipeline):
            return built
    raise InputError(f"--pipeline {ref}: {name} is not a @pipeline function or a Pipeline")


def step_pythonpath(ref: str | None, env: dict[str, str]) -> dict[str, str]:
    """The step processes' environment: the current directory on ``PYTHONPATH`` when a ``--pipeline`` is run."""
    if ref is None:
        return env
    here = os.getcwd()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return env if here in parts else {**env, "PYTHONPATH": os.pathsep.join([here, *parts])}


OWN_FLAGS = {"model": "--model", "data": "--data", "seed": "--seed", "max_steps": "--max-steps",
             "nproc_per_node": "--nproc-per-node"}


def parse_params(items: tuple[str, ...], pipeline: str | None = None) -> dict[str, Any]:
    """``--param NAME=VALUE`` pairs through the pipeline's one gate (:meth:`components.dsl.Pipeline.bind`):
    the built-in pipeline's, or ``--pipeline``'s."""
    raw: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        if key in OWN_FLAGS:
            raise InputError(f"--param {key}: use {OWN_FLAGS[key]} (it is validated there)")
        raw[key] = value
    return load_pipeline(pipeline).bind(raw, flag="--param")
