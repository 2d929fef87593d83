"""YAML that a user hands us, parsed to plain data or refused in one line naming the file and line.

PyYAML's ``safe_load`` raises more than ``yaml.YAMLError``: an explicit tag it cannot build
(``!!int x``, ``!!int`` alone, ``!!timestamp x``, ``!!bool maybe``) escapes from its constructors as
a ValueError, IndexError, AttributeError or KeyError, and deep nesting as a RecursionError. Every
loader of user YAML (price files, control-plane costs, Workflow YAML, KFP packages) goes through
here so each of those is one line, exit 2.
"""

from __future__ import annotations

from typing import Any

from components.errors import InputError


def safe_load(text: str, where: str, *, documents: bool = False) -> Any:
    """``yaml.safe_load`` (or, with ``documents``, the list of ``safe_load_all``); bad YAML is an InputError ``WHERE: ...``."""
    import yaml

    try:
        return list(yaml.safe_load_all(text)) if documents else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        at = f"line {mark.line + 1}: " if mark is not None else ""
        raise InputError(f"{where}: not valid YAML ({at}{problem})") from None
    except RecursionError:
        raise InputError(f"{where}: not valid YAML (nested too deeply)") from None
    except (ValueError, TypeError, AttributeError, LookupError, ArithmeticError) as exc:  # a tag its constructors cannot build
        raise InputError(f"{where}: not valid YAML (a tagged value that cannot be built: {type(exc).__name__})") from None
