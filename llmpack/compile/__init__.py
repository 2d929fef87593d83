"""``llmpack compile``: every backend's native artifacts, from the one pipeline object.

:mod:`.artifacts` writes each registered backend's artifacts (all or nothing) with the pod-spec
and GPU options applied, and :mod:`.prepull` the image pre-pull DaemonSet. It may import
``components``, the backend registry, the GPU catalogue and :mod:`llmpack.ui`'s options, never
:mod:`llmpack.run` or :mod:`llmpack.compare`; nothing is imported here, so ``llmpack --help``
stays fast.
"""
