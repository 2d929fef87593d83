"""A toy fourth backend, declared entirely in this folder (tests/backends/test_toy_backend.py registers it)."""
