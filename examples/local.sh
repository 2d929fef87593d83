#!/usr/bin/env bash
# The local paths, as a user types them (tiny model, built-in data, no GPU, no network).
# Run from the repository root after `make install` (or inside the .venv).
set -euo pipefail

# One path, one run, a summary table (add --json for a machine-readable summary).
llmpack run --backend direct
llmpack run --backend kfp --max-steps 30
llmpack run --backend argo --seed 1
llmpack run --backend mlflow --data examples/sample.jsonl --param seq_len=32

# finetune on 2 processes (torchrun, DDP on Gloo; NCCL with one GPU each on a GPU machine);
# --param strategy=fsdp shards the weights (FSDP2). Same global batch, same result as 1 process.
llmpack run --backend argo --nproc-per-node 2 --max-steps 30

# All paths side by side, three repeats each, a report with a break-even sentence.
llmpack compare --repeats 3 --report llmpack-report-costs \
  --control-plane-cost kfp=450 --control-plane-cost argo=120 --control-plane-cost mlflow=200

# The native tools on the committed artifacts, locally. `kfp dsl compile` and `hera generate yaml`
# import the pack: run them where it is installed (`pip install -e .`, or the .venv of `make install`).
mkdir -p llmpack-native  # here, not the shared /tmp
kfp dsl compile --py kfp_pipelines/pipeline.py --output llmpack-native/finetune.yaml   # == kfp_pipelines/finetune.yaml
hera generate yaml argo_workflows/workflow.py --to llmpack-native/finetune-argo.yaml  # == argo_workflows/finetune.yaml
mlflow run mlflow_projects/finetune --env-manager local -P max_steps=10 --experiment-name llmpack-native

# Rebuild a report later from MLflow alone:
#   llmpack report --run-group rg-... --out llmpack-report-rebuilt
