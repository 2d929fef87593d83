"""Is a run group in a local sqlite tracking store at all? Asked with :mod:`sqlite3`, in milliseconds.

``llmpack report --run-group ID`` on a mistyped ID used to take seconds before its "no such run
group" (MLflow's import and its store's set-up); this answers the common case first. It only
ever answers "absent": when the store holds the group, or cannot be read this way (not MLflow's
schema, locked, not a database), the caller asks MLflow as before, which says what is wrong.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

SQLITE_PREFIX = "sqlite:///"
RUN_GROUP_TAG = "llmpack.run_group"
RECORD_TAG = "llmpack.record"  # components.record.tracking.RECORD_TAG, not imported: this module stays light

# Any active pipeline record tagged with the group, in any experiment: absent here means absent from
# every search MLflow could make (llmpack.report.facts.runs_from_mlflow searches one experiment).
_QUERY = """
SELECT 1 FROM runs r
JOIN tags g ON g.run_uuid = r.run_uuid AND g.key = ? AND g.value = ?
JOIN tags k ON k.run_uuid = r.run_uuid AND k.key = ? AND k.value = 'pipeline'
WHERE r.lifecycle_stage = 'active'
LIMIT 1
"""


def run_group_absent(uri: str, run_group: str) -> bool:
    """True when ``uri`` is a readable sqlite MLflow store with no pipeline record of ``run_group``."""
    if not uri.startswith(SQLITE_PREFIX):
        return False
    path = Path(uri[len(SQLITE_PREFIX):])
    if not path.is_file():
        return False
    try:
        # Read-only, and no waiting on a writer's lock: a busy store is asked through MLflow instead.
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=0.5)) as db:
            return db.execute(_QUERY, (RUN_GROUP_TAG, run_group, RECORD_TAG)).fetchone() is None
    except sqlite3.Error:
        return False
