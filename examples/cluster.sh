#!/usr/bin/env bash
# Against a Kubernetes cluster with a GPU node pool (see the README's cluster walkthrough).
# Nothing here runs in tests; every command is what a user types.
set -euo pipefail

# 0. The step image and the MLflow secret the compiled artifacts reference.
docker build -t ghcr.io/YOUR_ORG/llmpack:0.1.0 . && docker push ghcr.io/YOUR_ORG/llmpack:0.1.0
llmpack compile --image ghcr.io/YOUR_ORG/llmpack:0.1.0
kubectl create namespace llmpack
kubectl -n llmpack create secret generic llmpack-mlflow --from-literal=tracking-uri=http://mlflow.mlflow.svc:5000

# 1. KFP, with its own CLI or ours (ours passes submitted_at / run_group / pipeline_run):
kfp run submit -e llmpack -f kfp_pipelines/finetune.yaml -r finetune-1 submitted_at=$(date +%s.%N) max_steps=200
KFP_HOST=http://localhost:8888 llmpack submit kfp --max-steps 200 --run-group rg-demo --wait

# 2. Argo, with its own CLI or ours (Hera has no submit command; `llmpack submit argo` is it):
argo submit -n llmpack argo_workflows/finetune.yaml -p submitted_at=$(date +%s.%N) -p max_steps=200 --watch
ARGO_SERVER=localhost:2746 ARGO_TOKEN="$(argo auth token)" llmpack submit argo --max-steps 200 --run-group rg-demo --wait

# 3. MLflow: `mlflow run --backend kubernetes` builds and pushes an image with a local Docker
#    daemon (mlflow/mlflow#8118); `llmpack submit mlflow` creates the run and the Job directly.
mlflow run mlflow_projects/finetune-k8s --backend kubernetes --backend-config mlflow_projects/finetune-k8s/kubernetes_config.json
MLFLOW_TRACKING_URI=http://localhost:5000 llmpack submit mlflow --max-steps 200 --run-group rg-demo --wait

# 4. Pod-level phases, offline from kubectl dumps, and the report from MLflow:
kubectl -n llmpack get pods -l llmpack.io/run-group=rg-demo -o json > pods.json
kubectl get nodes -o json > nodes.json
kubectl -n llmpack get events -o json > events.json
llmpack timeline --pods pods.json --nodes nodes.json --events events.json
llmpack report --run-group rg-demo --out llmpack-report
