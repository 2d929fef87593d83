"""kfp.local's noise in our runner only: its per-task no-op warnings ignored, the executor's input dump out
of the task logs."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from types import SimpleNamespace

from kfp_pipelines import local


def test_the_local_no_op_warnings_are_ignored_in_the_runner_child_only() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        local.quiet_local_noops()
        warnings.warn("Task 'tokenize': settings ['cpu_limit'] have no effect in the current local runner and will be "
                      "ignored.", UserWarning, stacklevel=1)
        warnings.warn('You may be attemping to run a task that uses custom or non-Python base image "x"',
                      RuntimeWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]
    # nothing was changed outside that block: llmpack's own process keeps its filters
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        warnings.warn("Task 'x': settings ['a'] have no effect in the current local runner", UserWarning, stacklevel=1)
    assert len(again) == 1


def test_the_executor_input_dump_stays_in_kfp_log_not_the_task_log(tmp_path: Path) -> None:
    lines = ["Executing task 'tokenize'\n",
             "    [KFP Executor 2026 INFO]: Got executor_input:\n", "    {\n", '        "inputs": {\n',
             '            "seed": 0\n', "        }\n", "    }\n",
             "    tokenized 200 rows\n", "Task 'tokenize' finished with status SUCCESS\n"]
    proc = SimpleNamespace(stdout=iter(lines))
    main_log, files = io.StringIO(), {}
    statuses, _ = local._split_output(proc, main_log, tmp_path, files)  # type: ignore[arg-type]
    for fh in files.values():
        fh.close()
    task_log = (tmp_path / "tokenize.log").read_text()
    assert statuses == {"tokenize": "SUCCESS"} and main_log.getvalue() == "".join(lines)
    assert '"inputs"' not in task_log and "Got executor_input (in kfp.log)" in task_log
    assert "tokenized 200 rows" in task_log
    # trial 10: the marker's line keeps its end, so the step's next line (its error line) is its own
    assert "Got executor_input (in kfp.log)\n" in task_log
    assert any(line.strip() == "tokenized 200 rows" for line in task_log.splitlines())
