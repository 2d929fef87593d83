"""What every ``llmpack`` command shows on a terminal besides its own output: help and library noise.

* **Help** wraps to 80 columns without breaking a word, a flag or a path: click wraps with
  :mod:`textwrap`, which breaks at hyphens (``llmpack-`` / ``report/latest``, ``--runs-`` /
  ``dir``), so :class:`HelpFormatter` wraps with the hyphens held; and a group lists each
  command's whole short help (wrapped when long), never cut with ``...``. Every command of the
  CLI is a :class:`Command` or :class:`Group`, so all of them format their help this way.
* **Library warnings** (MLflow's SQLAlchemy ``SADeprecationWarning``, kfp's and Hera's
  deprecations) say nothing a user can act on: :func:`quiet_library_warnings` ignores the
  warnings raised from those libraries' own modules, and only those. A warning raised from
  llmpack's code (or attributed to it by a library's ``stacklevel``) still shows.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import click

# The third-party packages whose own warnings are silenced (their import names), and only theirs.
LIBRARY_PACKAGES = ("mlflow", "sqlalchemy", "alembic", "kfp", "hera", "kubernetes", "google", "pydantic", "huey",
                    "git", "databricks", "opentelemetry", "graphene", "flask", "pkg_resources", "setuptools")
# ``module`` of warnings.filterwarnings (matched at its start)
LIBRARY_MODULES = rf"({'|'.join(LIBRARY_PACKAGES)})(\.|$)"

_HELD_HYPHEN = "\u2011"  # NON-BREAKING HYPHEN: one column, and textwrap does not break at it


def quiet_library_warnings() -> None:
    """Ignore the warnings the libraries of :data:`LIBRARY_PACKAGES` raise from their own modules.

    Idempotent (``filterwarnings`` replaces an equal filter). Call it again inside a
    ``warnings.catch_warnings()`` block that resets the filters.
    """
    warnings.filterwarnings("ignore", module=LIBRARY_MODULES)


def _held(write: Callable[[], None], formatter: click.HelpFormatter, start: int) -> None:
    write()
    formatter.buffer[start:] = [s.replace(_HELD_HYPHEN, "-") for s in formatter.buffer[start:]]


class HelpFormatter(click.HelpFormatter):
    """click's help formatter, except that text is never wrapped at a hyphen (only at spaces)."""

    def write_text(self, text: str) -> None:
        _held(lambda: super(HelpFormatter, self).write_text(text.replace("-", _HELD_HYPHEN)), self, len(self.buffer))

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        held = [(term, text.replace("-", _HELD_HYPHEN)) for term, text in rows]
        _held(lambda: super(HelpFormatter, self).write_dl(held, col_max, col_spacing), self, len(self.buffer))


class Context(click.Context):
    formatter_class = HelpFormatter


class Command(click.Command):
    """An ``llmpack`` command: its help is formatted by :class:`HelpFormatter`."""

    context_class = Context


class LocalFirstCommand(Command):
    """A command whose options after ``first_cluster_option`` apply with ``--cluster`` only: its help lists
    the local options first, then those under their own heading, so a local user reads a short page."""

    first_cluster_option = "concurrency"  # the dest of the first cluster-only option, in declaration order
    cluster_title = "Cluster options"

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        params = self.get_params(ctx)
        names = [p.name for p in params]
        cut = names.index(self.first_cluster_option) if self.first_cluster_option in names else len(params)
        help_option = self.get_help_option(ctx)
        local = [p for p in params[:cut]] + ([help_option] if help_option in params[cut:] else [])
        cluster = [p for p in params[cut:] if p is not help_option]
        for title, group in (("Options", local), (self.cluster_title, cluster)):
            rows = [r for r in (p.get_help_record(ctx) for p in group) if r is not None]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class Group(click.Group):
    """An ``llmpack`` command group: :class:`HelpFormatter` help, and its commands listed with
    their whole short help (wrapped when long, never cut with ``...``)."""

    context_class = Context
    command_class = Command
    group_class = type  # subgroups made with @group.group() are of the same class

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def command(name: str | None = None, **attrs: Any) -> Callable[[Callable[..., Any]], Command]:
    """``click.command`` making a :class:`Command` (for commands defined outside the ``main`` group)."""
    return click.command(name, cls=Command, **attrs)
