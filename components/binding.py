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


def check_length(name: str, value: Any, flag: str, *, label: str | None = None) -> None:
    """A text value over :data:`MAX_VALUE` characters: one InputError (the record would cut it), naming it
    ``label`` (default ``flag name``)."""
    if isinstance(value, str) and len(value) > MAX_VALUE:
        raise InputError(f"{label or f'{flag} {name}'}: {len(value):,} characters; at most {MAX_VALUE:,} "
                         "(MLflow's parameter limit)")


Rule = tuple[Callable[[Any], bool], str]  # (is the value allowed, what it must be: for the error line)


def where(key: str, flag: str, flags: Mapping[str, str] | None = None) -> str:
    """How an error line names the value of ``key``: its own flag (``--max-steps``) when it has one in ``flags``,
    else ``flag`` and the name (``--param lr``)."""
    return (flags or {}).get(key) or f"{flag} {key}"


def unknown_parameter(params: Mapping[str, Any], key: str, flag: str,
                      flags: Mapping[str, str] | None = None) -> InputError:
    """The one line for a value of a parameter the pipeline does not have, with the nearest name it has
    (``--param 'lr': unknown pipeline parameter; did you mean 'lr0'? (known: ...)``)."""
    import difflib

    own = (flags or {}).get(key)
    head = f"{own}: unknown pipeline parameter {key!r}" if own else f"{flag} {key!r}: unknown pipeline parameter"
    near = difflib.get_close_matches(key, list(params), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return InputError(f"{head}{hint} (known: {', '.join(params) or 'none'})")


def bind_params(params: Mapping[str, Param], values: Mapping[str, Any], *, flag: str = "parameter",
                flags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``values`` as the types ``params`` declare.

    Command-line text is coerced, an int taken as a float; anything else is one InputError, naming
    the value as :func:`where` does (``flags``: the parameters given by flags of their own).
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        param = params.get(key)
        if param is None:
            raise unknown_parameter(params, key, flag, flags)
        if isinstance(value, str) and param.type is not str:
            value = coerce(value, param.type, where(key, flag, flags))
        elif param.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif not isinstance(value, param.type) or (param.type is int and isinstance(value, bool)):
            label = (flags or {}).get(key) or f"{flag} {key!r}"
            raise InputError(f"{label} is {param.type.__name__}, got {type(value).__name__} {value!r}")
        check_length(key, value, flag, label=where(key, flag, flags))
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
