"""The CLI a person reads: at most 9 top-level commands, ``compare --help`` at most 30 options, the lab's
commands under ``llmpack cluster``, and their old spellings still working after one line naming the new one."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from llmpack.cli import OLD_SPELLINGS, main
from tests.conftest import REPO, llmpack

FIXTURES = REPO / "tests" / "fixtures" / "k8s"


def _help(*argv: str) -> str:
    result = CliRunner().invoke(main, [*argv, "--help"], prog_name="llmpack", terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.stdout


def listed_commands(help_text: str) -> list[str]:
    """The command names a group's help lists (each at the start of its line under ``Commands:``)."""
    return re.findall(r"^  ([a-z][\w-]*)  ", help_text.split("Commands:\n", 1)[1], re.M)


def listed_options(help_text: str) -> list[str]:
    """The options a command's help lists: one per line starting with a dash (``-h, --help`` included)."""
    return re.findall(r"^  (-[\w-]+)", help_text.split("\nOptions:\n", 1)[1], re.M)


def test_at_most_nine_top_level_commands_the_lab_in_one_group() -> None:
    names = listed_commands(_help())
    assert names == ["clean", "cluster", "compare", "compile", "report", "run", "sync"]
    assert len(names) <= 9
    assert set(listed_commands(_help("cluster"))) == {"compare", "doctor", "plan", "submit", "timeline"}
    assert listed_commands(_help("cluster", "plan")) == ["project"]


def test_compare_help_lists_at_most_30_options_none_of_the_clusters() -> None:
    options = listed_options(_help("compare"))
    assert 20 < len(options) <= 30, options
    cluster = set(listed_options(_help("cluster", "compare"))) - set(options)
    assert {"--kubeconfig", "--opencost", "--plan", "--image", "--concurrency"} <= cluster


def test_a_cluster_option_given_to_compare_names_the_command_that_has_it() -> None:
    result = CliRunner().invoke(main, ["compare", "--opencost", "http://x:9003"], prog_name="llmpack")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("llmpack: error: No such option") and "--opencost" in line
    assert line.endswith("(the cluster, pod and plan options are `llmpack cluster compare`'s)")


@pytest.mark.parametrize("old", sorted(OLD_SPELLINGS))
def test_an_old_spelling_says_the_new_one_then_works(old: str) -> None:
    new = " ".join(("cluster", *OLD_SPELLINGS[old]))
    result = CliRunner().invoke(main, [old, "--help"], prog_name="llmpack", terminal_width=80)
    assert result.exit_code == 0, result.output
    assert result.stderr == f"llmpack: `llmpack {old}` is now `llmpack {new}`\n"
    # the same help, under the old name
    assert result.stdout.split("\n", 1)[1] == _help(*new.split()).split("\n", 1)[1]
    assert old not in listed_commands(_help())  # hidden


def test_old_timeline_runs_the_new_one() -> None:
    argv = ["--pods", str(FIXTURES / "pods.json"), "--json"]
    old = CliRunner().invoke(main, ["timeline", *argv])
    new = CliRunner().invoke(main, ["cluster", "timeline", *argv])
    assert old.exit_code == new.exit_code == 0 and old.stdout == new.stdout and '"pod"' in new.stdout
    assert old.stderr == "llmpack: `llmpack timeline` is now `llmpack cluster timeline`\n" and new.stderr == ""


def test_compare_cluster_is_cluster_compare() -> None:
    old = CliRunner().invoke(main, ["compare", "--cluster", "--backends", "direct"], prog_name="llmpack")
    new = CliRunner().invoke(main, ["cluster", "compare", "--backends", "direct"], prog_name="llmpack")
    assert old.stderr.splitlines()[0] == "llmpack: `llmpack compare --cluster` is now `llmpack cluster compare`"
    assert old.exit_code == new.exit_code == 2 and old.stderr.splitlines()[1:] == new.stderr.splitlines()
    assert "'direct' has no cluster path" in new.stderr


def test_the_plan_group_still_plans_without_a_subcommand() -> None:
    plan = main.get_command(click.Context(main), "cluster").get_command(click.Context(main), "plan")
    assert isinstance(plan, click.Group) and plan.invoke_without_command
    result = CliRunner().invoke(main, ["cluster", "plan", "--capacity", "nonsense"], prog_name="llmpack")
    assert result.exit_code == 2 and "--capacity" in result.stderr


def test_debug_after_the_command_says_where_it_goes() -> None:
    """Issue 52 (fourth trial): ``llmpack run --debug`` said only "No such option '--debug'"."""
    r = llmpack("run", "--debug", cwd=REPO)
    assert r.returncode == 2 and r.stderr.strip() == (
        "llmpack: error: No such option '--debug'. (--debug goes before the command: llmpack --debug run ...)")


@pytest.mark.parametrize(("args", "line"), [
    (("run", "--backend", "kpf"), "llmpack: error: --backend 'kpf': choose one of direct, kfp, argo, mlflow; "
                                  "did you mean 'kfp'?"),
    (("run", "--backend", "airflow"), "llmpack: error: --backend 'airflow': choose one of direct, kfp, argo, mlflow"),
    (("compare", "--backends", "direct,argoo"), "llmpack: error: --backends: unknown backend 'argoo' (choose from "
                                                "direct, kfp, argo, mlflow); did you mean 'argo'?"),
])
def test_a_mistyped_backend_gets_the_nearest_name_and_only_a_near_one(args: tuple[str, ...], line: str) -> None:
    r = llmpack(*args, cwd=REPO)
    assert r.returncode == 2 and r.stderr.strip() == line, r.stderr
