"""``python -m components.run STEP_REF ...``: run one step (see :mod:`components.process.runner`)."""

from components.process.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
