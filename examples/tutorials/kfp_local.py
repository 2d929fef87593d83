"""Run a compiled KFP package with kfp.local, as a KFP user does: kfp's own loader, no llmpack code.

    python examples/tutorials/kfp_local.py build/finetune.yaml max_steps=5

Each task runs as a subprocess of this Python (``SubprocessRunner``); the exit handler closes the
pipeline's MLflow record at the end.
"""

import sys

import kfp.local
from kfp import components

package, *pairs = sys.argv[1:]
arguments = dict(pair.split("=", 1) for pair in pairs)
pipeline = components.load_component_from_file(package)
types = {name: spec.type for name, spec in pipeline.component_spec.inputs.items()}
casts = {"Integer": int, "Float": float, "Boolean": lambda v: v.lower() == "true"}
arguments = {k: casts.get(types.get(k, ""), str)(v) for k, v in arguments.items()}

kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root="build/kfp-root")  # git ignores build/
pipeline(mode="local", **arguments)
