"""A pipeline parameter's value on its way in: coerced from text, type-checked, held to its length.

The one parameter gate (:meth:`components.dsl.Pipeline.bind`) is built from these, and so is the
step process's own binding of its step's parameters; :mod:`components.names` names the length rule
beside its other rules (docs/internals/hostile-input.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from components.errors import InputError
from components.params import Param

MAX_VALUE = 6000  # MLflow's MAX_PARAM_VAL_LENGTH: a longer value would be cut in the record, kept whole elsewhere


def shown(value: Any) -> str:
    """The value as an error line shows it: ``repr``, cut to a readable length.

    A 100,000-character name is not echoed.
    """
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(str(value)):,} characters)"


def check_length(name: str, value: Any, flag: str) -> None:
    """A text value over :data:`MAX_VALUE` characters: one InputError (the record would cut it)."""
    if isinstance(value, str) and len(value) > MAX_VALUE:
        raise InputError(f"{flag} {name}: {len(value):,} characters; at most {MAX_VALUE:,} (MLflow's parameter limit)")


Rule = tuple[Callable[[Any], bool], str]  # (is the value allowed, what it must be: for the error line)


def bind_params(params: Mapping[str, Param], values: Mapping[str, Any], *, flag: str = "parameter") -> dict[str, Any]:
    """``values`` as the types ``params`` declare.

    Command-line text is coerced, an int taken as a float; anything else is one InputError.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        param = params.get(key)
        if param is None:
            raise InputError(f"{flag} {key!r}: unknown pipeline parameter (known: {', '.join(params)})")
        if isinstance(value, str) and param.type is not str:
            value = coerce(value, param.type, f"{flag} {key}")
        elif param.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif not isinstance(value, param.type) or (param.type is int and isinstance(value, bool)):
            raise InputError(f"{flag} {key!r} is {param.type.__name__}, got {type(value).__name__} {value!r}")
        check_length(key, value, flag)
        out[key] = value
    return out



def coerce(value: str, typ: type, where: str) -> Any:
    """``value`` (command-line text) as ``typ``; a bad value is one :class:`InputError` naming ``where``."""
    try:
        if typ is bool:
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no", ""):
                return False
            raise ValueError(value)
        return typ(value)
    except ValueError:
        raise InputError(f"{where}: {value!r} is not a valid {typ.__name__}") from None
