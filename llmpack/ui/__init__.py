"""What a person sees and types: the shared options, help and terminal output, numbers and words.

:mod:`.options` and :mod:`.pod_options` declare the flags commands share (checked once),
:mod:`.terminal` the help and library noise, :mod:`.progress` the live signal from the steps'
own files, :mod:`.display` the status line and tables, :mod:`.numbers` how figures are written
and :mod:`.glossary` the one list of terms. It may import ``components``, the backend registry and
the GPU catalogue; :mod:`.display`'s tables import what they show inside their functions.
Nothing is imported here, so ``llmpack --help`` stays fast.
"""
