"""``python -m components.record ...``: close a pipeline run's record (see :mod:`components.record.close`)."""

from components.record.close import main

if __name__ == "__main__":
    raise SystemExit(main())
