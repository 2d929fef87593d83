#!/usr/bin/env bash
# Against a Kubernetes cluster with a GPU node pool (see the README's cluster walkthrough).
# Nothing here runs in tests; every command is what a user types, in the repository root.
set -euo pipefail

# 0. The step image, compiled into build/llmpack/ (the committed artifacts keep the default image),
#    and the MLflow secret the compiled artifacts reference (a URI without credentials: those go in
#    the optional keys username/password/token).
docker build -t ghcr.io/YOUR_ORG/llmpack:0.1.0 . && docker push ghcr.io/YOUR_ORG/llmpack:0.1.0
llmpack compile --image ghcr.io/YOUR_ORG/llmpack:0.1.0
#    With the model and data on volumes, a gated HF model's token and a private registry (docs/cluster.md),
#    every pod of every path gets them; then add --model /models/llama-3.2-1b --data /data/train.jsonl below:
#      llmpack compile --image ghcr.io/YOUR_ORG/llmpack@sha256:DIGEST --image-pull-secret regcred \
#        --model-pvc llmpack-models --data-pvc llmpack-data --hf-token-secret hf-token
#      llmpack cluster doctor --model-pvc llmpack-models --data-pvc llmpack-data --hf-token-secret hf-token --image-pull-secret regcred
B=build/llmpack
kubectl create namespace llmpack
kubectl -n llmpack create secret generic llmpack-mlflow --from-literal=tracking-uri=http://mlflow.mlflow.svc:5000 \
    --from-literal=signing-key="$(openssl rand -hex 32)"
# Argo: a default artifact repository (tasks pass artifacts; see the README) and RBAC for the
# emissary executor, as the workflow's service account (`default`: the Workflow names none).
kubectl -n llmpack create role argo-executor --verb=create,patch --resource=workflowtaskresults.argoproj.io
kubectl -n llmpack create rolebinding argo-executor --role=argo-executor --serviceaccount=llmpack:default

# 1. KFP, with its own CLI or ours (ours passes submitted_at / run_group / pipeline_run):
kfp run submit -e llmpack -f $B/kfp_pipelines/finetune.yaml -r finetune-1 submitted_at=$(date +%s.%N) max_steps=200
KFP_HOST=http://localhost:8888 llmpack cluster submit kfp --package $B/kfp_pipelines/finetune.yaml --max-steps 200 --run-group rg-demo --wait

# 2. Argo, with its own CLI or ours (Hera has no submit command; `llmpack cluster submit argo` is it):
argo submit -n llmpack $B/argo_workflows/finetune.yaml -p submitted_at=$(date +%s.%N) -p max_steps=200 --watch
ARGO_SERVER=localhost:2746 ARGO_TOKEN="$(argo auth token)" \
  llmpack cluster submit argo --workflow $B/argo_workflows/finetune.yaml --max-steps 200 --run-group rg-demo --wait

# 3. MLflow: `mlflow run --backend kubernetes` builds and pushes an image with a local Docker
#    daemon (mlflow/mlflow#8118), and puts KUBE_MLFLOW_TRACKING_URI (else MLFLOW_TRACKING_URI) into the
#    Job as a literal value: no credentials in it. Typed here, in the repository root: the config's
#    kube-job-template-path is relative to where `mlflow run` is typed.
KUBE_MLFLOW_TRACKING_URI=http://mlflow.mlflow.svc:5000 mlflow run $B/mlflow_projects/finetune-k8s \
  --backend kubernetes --backend-config $B/mlflow_projects/finetune-k8s/kubernetes_config.json
#    `llmpack cluster submit mlflow` creates the run and the Job directly; the Job's tracking URI comes only
#    from the Secret, so the record goes to that server (as this machine reaches it):
MLFLOW_TRACKING_URI=http://localhost:5000 \
  llmpack cluster submit mlflow --image ghcr.io/YOUR_ORG/llmpack:0.1.0 --max-steps 200 --run-group rg-demo --wait

# 4. Pod-level phases, offline from kubectl dumps, and the report from MLflow:
kubectl -n llmpack get pods -l llmpack.io/run-group=rg-demo -o json > pods.json
kubectl get nodes -o json > nodes.json
kubectl -n llmpack get events -o json > events.json
llmpack cluster timeline --pods pods.json --nodes nodes.json --events events.json
llmpack report --run-group rg-demo --out llmpack-report
