"""Errors the pack raises for bad input: one clear line, exit code 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user: a file, a field, a flag. The message is one line naming it."""

    exit_code = 2


class PipelineValidationError(InputError):
    """The pipeline object itself is invalid (cycle, missing input, bad name...)."""


class StepFailed(RuntimeError):
    """A step ran and failed (e.g. the quality gate). Exit code 1."""

    exit_code = 1


class RunFailed(RuntimeError):
    """A pipeline run failed in a step; ``step`` names it. Exit code 1."""

    exit_code = 1

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"step {step!r} failed: {message}")
        self.step = step


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the client: open records end KILLED, exit 128 + signal (130, 143).

    ``kept`` collects the run directories moved aside as ``<run>.failed`` on the way out, so the
    message can name them.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum
        self.kept: list[str] = []
