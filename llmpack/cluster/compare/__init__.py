"""``llmpack cluster compare``: every path submitted to one cluster, its pods watched, each run measured.

May import the pack (``llmpack.compare``'s statistics and plan, ``llmpack.report``, ``llmpack.ui``) and the
lab's ``k8s/``; nothing is imported here, so ``llmpack --help`` stays fast.
"""
