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
# Images by digest: a tag like :0.1.0 can be pushed over; a digest cannot. After pushing, take the
# digest and compile with it, so every path's pods run exactly this build:
#
#   docker build -t registry.example.com/team/llmpack:0.1.0 .
#   docker push registry.example.com/team/llmpack:0.1.0
#   docker inspect --format '{{index .RepoDigests 0}}' registry.example.com/team/llmpack:0.1.0
#     -> registry.example.com/team/llmpack@sha256:<64 hex digits>
#   llmpack compile --image registry.example.com/team/llmpack@sha256:<64 hex digits>
#
# CUDA torch comes from the base image: a current CUDA build inside pyproject.toml's torch range
# (torch>=2.6,<3: transformers 5 disables older torch, FSDP2's fully_shard needs 2.6).
# tests/test_pins.py fails when this default leaves the range. `pip install .` keeps the base's
# torch: the build pins it to the version already there, so a requirement that would replace it
# fails the build instead of pulling a second, CUDA-mismatched torch. The base's Python (3.11 in
# the pytorch/pytorch images) must meet requires-python (>=3.11).
# The tag below exists on Docker Hub (checked: public Dockerfiles build FROM it, one pinning its
# digest, sha256:7b324d212a4450795b49edba9949b7cdc72429148a64e974334bfe5774d51385, and asserting
# Python 3.11 inside). Another base: --build-arg BASE_IMAGE=pytorch/pytorch:<version>-cuda<x.y>-cudnn9-runtime,
# or pin this one by digest: --build-arg BASE_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime@sha256:<digest>.
ARG BASE_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
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
COPY docker/selfcheck.py /opt/llmpack/docker/selfcheck.py
# The self-check (docker/selfcheck.py) fails the build on pins that cannot load a model: every
# requirement in range, transformers' model classes and peft imported, the tiny model saved in
# bf16, loaded back in fp32 through AutoModelForCausalLM, LoRA-wrapped and trained one step.
RUN python -c "from importlib.metadata import version; print('torch==' + version('torch'))" > /tmp/keep-torch.txt \
 && python -m pip install --constraint /tmp/keep-torch.txt . \
 && rm /tmp/keep-torch.txt \
 && python docker/selfcheck.py

# Non-root, unprivileged: uid/gid 1000, matching runAsUser in the Kubernetes manifests.
RUN (getent group ${LLMPACK_UID} || groupadd --gid ${LLMPACK_UID} llmpack) \
 && (getent passwd ${LLMPACK_UID} || useradd --uid ${LLMPACK_UID} --gid ${LLMPACK_UID} --create-home --shell /bin/bash llmpack) \
 && mkdir -p /workspace && chown ${LLMPACK_UID}:${LLMPACK_UID} /workspace
USER ${LLMPACK_UID}:${LLMPACK_UID}
WORKDIR /workspace

CMD ["python", "-m", "components.run", "--help"]
