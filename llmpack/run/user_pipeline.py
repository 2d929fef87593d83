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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from components.errors import InputError

if TYPE_CHECKING:
    from components.dsl import Pipeline

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
        missing = exc.name or ""
        if missing and not (module_name == missing or module_name.startswith(missing + ".")):
            raise InputError(f"--pipeline {ref}: importing {module_name} failed: it imports {missing!r}, which is "
                             "not installed in llmpack's Python") from None  # the module was found; its import was not
        raise InputError(f"--pipeline {ref}: cannot import {module_name} ({exc}); run llmpack from the directory that "
                         "holds it, or add that directory to PYTHONPATH") from None
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed on import: one line naming it
        raise InputError(f"--pipeline {ref}: importing {module_name} failed ({type(exc).__name__}: {exc})") from None
    try:
        obj = getattr(module, name)
    except AttributeError:
        import difflib

        near = difflib.get_close_matches(name, [n for n in vars(module) if not n.startswith("_")], n=1)
        raise InputError(f"--pipeline {ref}: {module_name} has no {name}"
                         + (f"; did you mean {module_name}:{near[0]}?" if near else "")) from None
    if isinstance(obj, Pipeline):
        return obj.validate()
    from components.dsl import Step

    if isinstance(obj, Step):
        raise InputError(f"--pipeline {ref}: {name} is a @step; --pipeline takes a @pipeline function that calls it")
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
    """The step processes' environment: the current directory on ``PYTHONPATH`` when a ``--pipeline`` is run.

    An empty entry (``PYTHONPATH=:/x``, what ``export PYTHONPATH=$PYTHONPATH:/x`` makes when it was unset) is
    the working directory to Python, even under ``-P``: it is dropped, so nothing from there is imported
    (``sitecustomize.py``...) unless ``--pipeline`` asks for it."""
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ref is not None and os.getcwd() not in parts:
        parts.insert(0, os.getcwd())
    if parts:
        return {**env, "PYTHONPATH": os.pathsep.join(parts)}
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


# The pipeline parameters the run commands give by flags of their own (``--max-steps 5``, not ``--param``).
OWN_FLAGS = {"model": "--model", "data": "--data", "seed": "--seed", "max_steps": "--max-steps",
             "nproc_per_node": "--nproc-per-node"}
# Those of them that are run options (:class:`llmpack.run.local.RunOptions` fields, always set): untyped, the
# pipeline's own default.
RUN_FIELDS = ("model", "data", "seed", "max_steps")


def raw_params(items: tuple[str, ...]) -> dict[str, str]:
    """``--param NAME=VALUE`` pairs as text, for a compiled file whose own parameters check them."""
    raw: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        raw[key] = value
    return raw


def parse_params(items: tuple[str, ...], pipeline: str | Pipeline | None = None) -> dict[str, Any]:
    """``--param NAME=VALUE`` pairs through the pipeline's one gate (:meth:`components.dsl.Pipeline.bind`):
    the built-in pipeline's, or ``--pipeline``'s (its reference, or the pipeline itself)."""
    pipe = load_pipeline(pipeline) if pipeline is None or isinstance(pipeline, str) else pipeline
    raw: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        if key in OWN_FLAGS and key in pipe.params:
            raise InputError(f"--param {key}: use {OWN_FLAGS[key]} (it is validated there)")
        raw[key] = value
    if "promote" in raw and "promote" not in pipe.params:  # --no-promote comes here as promote=false
        raise InputError(f"--no-promote: the pipeline has no 'promote' parameter (it registers nothing to promote; "
                         f"known: {', '.join(pipe.params) or 'none'})")
    return pipe.bind(raw, flag="--param")


def run_values(pipeline: str | None, typed: Mapping[str, Any], items: tuple[str, ...]) -> dict[str, Any]:
    """The values of a run command (``run``, ``compare``) as the pipeline's own signature has them.

    ``typed``: the flags of :data:`OWN_FLAGS` the user typed (``click``'s parameter source, not their
    defaults), by parameter name. Each goes through the pipeline's one gate, so a flag for a parameter
    the pipeline lacks is refused as an unknown ``--param`` is; an untyped one is the pipeline's default
    (``max_steps: int = 30`` runs 30 steps, not the shipped pipeline's 120). Returns the
    :class:`~llmpack.run.local.RunOptions` fields: :data:`RUN_FIELDS` the pipeline has, and ``params``.
    """
    pipe = load_pipeline(pipeline)
    given = pipe.bind({k: v for k, v in typed.items() if v is not None}, flag="--param", flags=OWN_FLAGS)
    own = {name: given.get(name, pipe.params[name].default) for name in RUN_FIELDS if name in pipe.params}
    return {**own, "params": parse_params(items, pipe)}
