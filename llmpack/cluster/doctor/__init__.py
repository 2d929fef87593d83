"""``llmpack cluster doctor``: check, before GPU-hours are spent, that a cluster has what the artifacts need.

:mod:`.command` is the click command and the order of the checks, :mod:`.checks` the checks
themselves (each with its fix), :mod:`.reader` the one small reader over the Kubernetes API and
:mod:`.pods` what the compiled artifacts ask of a cluster. It may import ``components``, the backend
registry, the GPU catalogue and :mod:`llmpack.ui`, never :mod:`llmpack.compare` or
:mod:`llmpack.run`; nothing is imported here, so ``llmpack --help`` stays fast.
"""
