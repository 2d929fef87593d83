"""The rules for names that leave a run's values and become something else: a path, a filter, a label, a model.

Each such name is held to its rule once, where the run's values come in (the parameter gate, the
step process, the local runners' entry points), so a name that would escape its directory or break
a query is one :class:`InputError` before anything is written: identities (``pipeline_run``,
``run_group``) are empty or DNS-1123 labels; ``model_name`` follows MLflow's registered-model rule
(at most :data:`MAX_MODEL_NAME`); any text parameter is at most :data:`MAX_VALUE` characters; a
filter value is quoted only when it can be (:func:`filter_literal`). Each rule and why:
docs/internals/names-and-secrets.md.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from components.dsl import MAX_VALUE, check_length, is_dns1123_label, shown  # noqa: F401 - MAX_VALUE: the rule, named here too
from components.errors import InputError

MAX_MODEL_NAME = 256  # MLflow's registered_models.name column: String(256)
IDENTITY_NAMES = ("pipeline_run", "run_group")


def identity_problem(value: str) -> str | None:
    """Why ``value`` cannot be a ``pipeline_run``/``run_group`` id, or None."""
    if value == "" or is_dns1123_label(value):
        return None
    return ("must be a DNS-1123 label (lower-case letters, digits, '-'; at most 63): "
            "it names the run's directory and its record")


def model_name_problem(value: str) -> str | None:
    """Why MLflow's model registry would refuse ``value`` as a registered-model name, or None."""
    if not value.strip():
        return "must be a non-empty name"
    if len(value) > MAX_MODEL_NAME:
        return f"must be at most {MAX_MODEL_NAME} characters (the model registry's limit)"
    if "/" in value or ":" in value:
        return "must not contain '/' or ':' (an MLflow registered-model name)"
    norm = posixpath.normpath(value)
    if norm != value or norm in (".", "..") or norm.startswith(".."):
        return "must not change when read as a path (no '.', '..', '//' or trailing '/')"
    if any(ord(c) < 32 for c in value):
        return "must not contain control characters"
    return None


def check(value: str, problem: Callable[[str], str | None], what: str) -> str:
    """``value`` when ``problem`` finds nothing, else one :class:`InputError` naming ``what``."""
    found = problem(value)
    if found:
        raise InputError(f"{what}: {shown(value)} {found}")
    return value


def check_identity(values: Mapping[str, Any], flag: str) -> None:
    """The run's identity values (``pipeline_run``, ``run_group``) held to their rule.

    A value that breaks it is one InputError naming ``flag``.
    """
    for name in IDENTITY_NAMES:
        if name in values and values[name] is not None:
            check(str(values[name]), identity_problem, f"{flag} {name}")


def check_values(values: Mapping[str, Any], flag: str) -> None:
    """The gate for a run's values wherever they come in as text (a local runner's ``-p``, ``mlflow run -P``,
    a step's ``--param``): identity ids, the registered-model name and every value's length, one InputError."""
    for name, value in values.items():
        check_length(name, value, flag)
    check_identity(values, flag)
    if isinstance(values.get("model_name"), str):
        check(values["model_name"], model_name_problem, f"{flag} model_name")


def filter_literal(value: str) -> str:
    """``value`` as a quoted MLflow search-filter value; refused when MLflow's grammar cannot hold it.

    MLflow strips the quotes and unescapes nothing, so a value with a quote, backtick, backslash
    or control character cannot be searched for exactly: an :class:`InputError`, never a query
    that means something else.
    """
    if any(c in value for c in "'\"`\\") or any(ord(c) < 32 for c in value):
        raise InputError(f"{shown(value)}: cannot be searched for in MLflow "
                         "(quotes, backslashes or control characters)")
    return f"'{value}'"
