"""``python -m components.run STEP_REF ...``: run one step (see :mod:`components.runtime`)."""

from components.runtime import main

if __name__ == "__main__":
    raise SystemExit(main())
