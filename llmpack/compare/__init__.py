"""``llmpack compare``: the same pipeline through several paths, then verdicts only beyond noise.

The plan (:mod:`.plan`: which paths, how many rounds, in what order), the local loop
(:mod:`.comparison`) and the one that runs until every start-up verdict is decided
(:mod:`.until_decided`, judged by :mod:`.sequential`; fixed repeats by :mod:`.stats`), and the
cluster side (:mod:`.cluster` submits each path, :mod:`.session` watches, measures and records one
run). It may import ``components``, the backend registry, :mod:`llmpack.run`, :mod:`llmpack.compile`,
:mod:`llmpack.cluster.k8s` and :mod:`llmpack.ui`; nothing is imported here, so ``llmpack --help`` stays fast.
"""
