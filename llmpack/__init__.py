"""llmpack: the CLI, side-by-side comparison, reports and the Kubernetes pod watcher."""

__version__ = "0.1.0"
