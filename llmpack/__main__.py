"""``python -m llmpack`` is the ``llmpack`` command."""

from llmpack.cli import main

if __name__ == "__main__":
    main()
