# The llmpack step image: every step of every orchestrator runs `python -m components.run ...` in it.
#
#   docker build -t ghcr.io/llmpack/llmpack:0.1.0 .
#
# The image name is a parameter, not a constant: build and push under your own name, then compile
# with it (`LLMPACK_IMAGE=registry.example.com/team/llmpack:0.1.0 llmpack compile`, or
# `mlflow_projects.compiler.write_project(pipe, out, image=...)`); the default,
# ghcr.io/llmpack/llmpack:0.1.0, is the one in the step specs (components/dsl.py, Execution.image).
# For the MLflow Kubernetes backend this is docker_env.image in mlflow_projects/finetune-k8s/MLproject:
# MLflow builds FROM it, adds the project directory, and pushes to kubernetes_config.json's repository-uri.
#
# CUDA torch comes from the base image (pip keeps it: it satisfies torch>=2.4,<3). Choose another
# base with --build-arg BASE_IMAGE=pytorch/pytorch:<version>-cuda<x.y>-cudnn9-runtime.
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}

ARG LLMPACK_UID=1000
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/tmp/huggingface \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /opt/llmpack
# Only what the package needs (no tests, runs or virtualenvs from the build context). The source
# tree stays here too: `llmpack submit mlflow` runs the project at /opt/llmpack/mlflow_projects/finetune-k8s.
COPY pyproject.toml README.m[d] ./
COPY components/ components/
COPY kfp_pipelines/ kfp_pipelines/
COPY argo_workflows/ argo_workflows/
COPY mlflow_projects/ mlflow_projects/
COPY llmpack/ llmpack/
RUN python -m pip install . \
 && python -c "import components, torch; print('llmpack image: torch', torch.__version__, 'cuda', torch.version.cuda)"

# Non-root, unprivileged: uid/gid 1000, matching runAsUser in the Kubernetes manifests.
RUN (getent group ${LLMPACK_UID} || groupadd --gid ${LLMPACK_UID} llmpack) \
 && (getent passwd ${LLMPACK_UID} || useradd --uid ${LLMPACK_UID} --gid ${LLMPACK_UID} --create-home --shell /bin/bash llmpack) \
 && mkdir -p /workspace && chown ${LLMPACK_UID}:${LLMPACK_UID} /workspace
USER ${LLMPACK_UID}:${LLMPACK_UID}
WORKDIR /workspace

CMD ["python", "-m", "components.run", "--help"]
