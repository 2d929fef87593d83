"""prepare_data: load instruction rows (built-in, JSONL or HF id), validate, split by seed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from components.dsl import Dataset, Execution, Output, Resources, step
from components.reporting import current, metric
from components.serving.sealed import DATASET, sealed_output
from components.training.data import BUILTIN, builtin_split, load_rows, split_rows, write_jsonl


@contextmanager
def split_output(dataset: Output[Dataset]) -> Iterator[Path]:
    """A private directory to write a split in, sealed as prepare_data's on a clean exit, so tokenize takes it.

    For a step of your own that makes the data tokenize reads: write ``train.jsonl`` and ``eval.jsonl``
    (one JSON object per line, ``prompt`` and ``response``) and any file of yours into the directory it
    yields; on leaving the block they are copied into ``dataset`` and signed with your key
    (components.serving.sealed). tokenize refuses a split written any other way, or changed since.
    """
    tel = current()
    with sealed_output(Path(dataset.path), DATASET, tel.ctx.pipeline_run if tel is not None else "") as out:
        yield out


@step(execution=Execution(resources=Resources(cpu=1, memory="2Gi"), hf_cache=True))
def prepare_data(
    dataset: Output[Dataset],
    data: str = "builtin",
    seed: int = 0,
    eval_fraction: float = 0.1,
    skip_bad_rows: bool = False,
    builtin_size: int = 2000,
) -> None:
    """Load instruction/response rows, validate every row, and split train/eval by seed."""
    # The built-in set is split by construction (eval made only of held-out words and numbers); a
    # user's rows by prompt identity, so no eval prompt is in training; duplicates are counted.
    if data == BUILTIN:
        train, evaluation = builtin_split(builtin_size, seed, eval_fraction)
        skipped = duplicates = 0
        rows = train + evaluation
    else:
        rows, skipped = load_rows(data, seed=seed, skip_bad_rows=skip_bad_rows, builtin_size=builtin_size)
        train, evaluation, duplicates = split_rows(rows, seed=seed, eval_fraction=eval_fraction)
    dropped = len(rows) - len(train) - len(evaluation)  # copies of an eval prompt: eval keeps one, train none
    meta = {"source": data, "rows": len(rows), "train": len(train), "eval": len(evaluation), "skipped": skipped,
            "duplicate_rows": duplicates, "dropped_rows": dropped}
    # written in this process's own directory, then copied out and sealed: tokenize reads exactly this split
    with split_output(dataset) as out:
        write_jsonl(out / "train.jsonl", train)
        write_jsonl(out / "eval.jsonl", evaluation)
        (out / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    metric("rows", len(rows))
    metric("skipped_rows", skipped)
    metric("duplicate_rows", duplicates)
    metric("dropped_rows", dropped)
