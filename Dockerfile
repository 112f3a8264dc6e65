# longhaul trainer image: veRL + vLLM + longhaul, with the policy and user-simulator models baked in, for
# GPU nodes without network access (Kubernetes Jobs, Slurm through Apptainer or Pyxis).
#
#   make image-trainer                       # CI variant: local Debian base, STACK=cpu-min, a tiny baked model
#   images/build.sh trainer STACK=cuda13     # a connected site: CUDA base, real stack, models from the Hub
#
# How it is put together (images/README.md has the whole procedure):
#   builder      the base image + python3-venv: makes /opt/venv (same Python path as the runtime image)
#   wheelhouse   every wheel the image installs, made beforehand by images/wheelhouse.sh on a connected
#                machine. Nothing in this file reaches a package index.
#   project      the longhaul wheel, built from the source tree (offline, build backend from the wheelhouse)
#   deps         /opt/venv <- `pip install --no-index --find-links /wheelhouse` of the stack STACK selects
#   models-hub   `hf download` of pinned revisions into an HF cache (token only as a build secret)
#   models-local a models directory from the build context (CI: a tiny model made by the test)
#   runtime      base image + python3 + /opt/venv + /models + the project wheel; non-root, offline.
#
# Only Dockerfile 1.2 features (buildah 1.28, docker 20.10 BuildKit): no `syntax` line (BuildKit would pull
# a frontend image, which fails offline) and no heredocs.
#
# The tags are for readers; the digests are what gets pulled. images/stacks/<STACK>/stack.env holds the
# matching base images for each stack. Refresh a digest on a connected machine with
#   skopeo inspect --format '{{.Digest}}' docker://docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04
ARG BUILDER_IMAGE=docker.io/nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6
ARG BASE_IMAGE=docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04@sha256:2ab6381d970b211fb93853796dc6707eb8a72575a375c422b17cf4d8b2641701
# hub: download the models below at build time; local: copy LOCAL_MODELS from the build context.
ARG MODEL_SRC=hub

# ---------------------------------------------------------------------------------------------------------
FROM ${BUILDER_IMAGE} AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INDEX=1
# Unversioned package names on purpose: the same line must work on Ubuntu 24.04 (CUDA bases, Python 3.12)
# and on Debian 12 (CI base, Python 3.11); the base image digest pins what they resolve to.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# ---------------------------------------------------------------------------------------------------------
FROM builder AS wheelhouse
# SHELL is repeated per stage: OCI image configs (buildah's default format) do not carry it.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG STACK=cuda13
# build/wheelhouse/<STACK>/ is made by `images/wheelhouse.sh <STACK>` (a connected machine, or CI from PyPI).
COPY build/wheelhouse/${STACK}/ /wheelhouse/

# ---------------------------------------------------------------------------------------------------------
# The project wheel, in a stage of its own: editing the source rebuilds this and the last layer only.
FROM builder AS project
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# README.m[d]: the glob lets the build go on while the readme is absent (setuptools only warns).
COPY pyproject.toml README.m[d] /src/
COPY pipelines/ /src/pipelines/
# setuptools and wheel for the isolated build come from the wheelhouse too. COPY --from, not
# `RUN --mount=type=bind,from=<stage>`: buildah 1.28 intermittently lost such mounts of cached stages.
COPY --from=wheelhouse /wheelhouse /wheelhouse
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-index --find-links /wheelhouse --no-deps \
        --wheel-dir /dist /src

# ---------------------------------------------------------------------------------------------------------
FROM builder AS deps
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG STACK=cuda13
# Only the stack files and pyproject.toml: editing the source does not rebuild this (large) layer.
COPY images/stacks/${STACK}/ /stack/
COPY pyproject.toml images/project-requirements.py /stack/
# Each stack is a matched set (images/stacks/*/requirements.txt):
#   cuda13  verl 0.9.1 + vllm 0.24.0 + torch 2.11.0 + flash-attn 2.8.3   (driver >= 580)
#   cpu-min the project + huggingface_hub only                            (CI default)
# No autoawq in any stack: vLLM loads AWQ checkpoints (the simulator's Qwen2.5-72B-Instruct-AWQ) with its own
# awq / awq_marlin kernels; autoawq is deprecated, source-only and pinned to torch 2.6, so it would only conflict.
# (This stage is not shipped; only /opt/venv is copied out of it.)
COPY --from=wheelhouse /wheelhouse /wheelhouse
RUN . /stack/stack.env \
    && python3 /stack/project-requirements.py /stack/pyproject.toml --extras "${PROJECT_EXTRAS:-}" \
        > /stack/project.txt \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse \
        -c /stack/constraints.txt -r /stack/project.txt -r /stack/requirements.txt

# ---------------------------------------------------------------------------------------------------------
FROM deps AS models-hub
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Pinned commits, not branches: the image is rebuilt bit-for-bit from the same arguments.
ARG POLICY_MODEL=Qwen/Qwen2.5-7B-Instruct
ARG POLICY_REVISION=a09a35458c702b33eeacc393d103063234e8bc28
ARG SIMULATOR_MODEL=Qwen/Qwen2.5-72B-Instruct-AWQ
ARG SIMULATOR_REVISION=698703eae6604af048a3d2f509995dc302088217
# A Hub mirror (e.g. a site's internal one); empty = the public Hub.
ARG HF_ENDPOINT=
COPY images/bake-models.sh /usr/local/bin/bake-models.sh
# The token is a build secret (`--secret id=hf_token,src=FILE`): mounted for this step only, read by
# huggingface_hub through HF_TOKEN_PATH, never written to a layer. Public models need no secret.
RUN --mount=type=secret,id=hf_token \
    PATH=/opt/venv/bin:$PATH HF_ENDPOINT="${HF_ENDPOINT}" bash /usr/local/bin/bake-models.sh /models/hf \
        "${POLICY_MODEL}" "${POLICY_REVISION}" "${SIMULATOR_MODEL}" "${SIMULATOR_REVISION}"

# ---------------------------------------------------------------------------------------------------------
FROM builder AS models-local
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A directory in the build context laid out like /models (hf/hub/models--ORG--NAME/... and/or plain model
# directories). CI writes a tiny model there at test time.
ARG LOCAL_MODELS=build/models
COPY ${LOCAL_MODELS}/ /models/
# Apptainer and Charliecloud ignore USER and run as the calling user: everything must be world-readable.
RUN chmod -R a+rX /models

# ---------------------------------------------------------------------------------------------------------
# hadolint ignore=DL3006
FROM models-${MODEL_SRC} AS models

# ---------------------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ARG STACK=cuda13
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# uid 1000 already exists in Ubuntu 24.04 images ("ubuntu"); elsewhere add it without useradd (not every
# minimal base has it). /scratch, /runs and HOME are the only writable places the image expects.
# gcc, libc6-dev and python3-dev: what is compiled on first use at run time. Triton (torch 2.11 pins 3.6) builds
# its cuda_utils module and every kernel launcher with a C compiler against Python.h, and the simulator, the
# rollout vLLM, the evaluation server and the actor (veRL's use_torch_compile) all reach it; without them the
# first server fails with "Failed to find C compiler". tests/e2e/images compiles and imports a C extension in
# the built image the way Triton's build helper does.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates gcc libc6-dev python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && { getent group 1000 >/dev/null || echo "longhaul:x:1000:" >> /etc/group; } \
    && { getent passwd 1000 >/dev/null \
         || echo "longhaul:x:1000:1000:longhaul:/home/longhaul:/bin/bash" >> /etc/passwd; } \
    && mkdir -p /home/longhaul /scratch/cache /runs /etc/longhaul \
    && chown -R 1000:1000 /home/longhaul /scratch /runs \
    && chmod 1777 /scratch /scratch/cache /runs

# Offline and quiet by default (the same set as longhaul.constants.OFFLINE_ENV), models from /models/hf,
# every cache that vLLM / Triton / torch.compile write at run time under /scratch (mount fast local disk).
# DL3064 ("sensitive data") is a false positive on TOKENIZERS_PARALLELISM; no secret is set here, and
# tests/unit/images checks that no ARG or ENV name is a token, key, password or secret.
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/home/longhaul \
    HF_HOME=/models/hf \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    RAY_DEDUP_LOGS=0 \
    PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false \
    PIP_NO_INDEX=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    XDG_CACHE_HOME=/scratch/cache \
    VLLM_CACHE_ROOT=/scratch/cache/vllm \
    TRITON_CACHE_DIR=/scratch/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/scratch/cache/inductor \
    LONGHAUL_IMAGE_STACK=${STACK}

# Layer order: OS -> dependencies (large, rarely changes) -> models (large, changes with a revision) -> project.
COPY --from=deps /opt/venv /opt/venv
COPY --from=models /models /models
# The wheel (about 150 kB) stays in the COPY layer; a bind mount from the stage would avoid that but is not
# reliable in buildah 1.28.
COPY --from=project /dist/ /tmp/longhaul-dist/
RUN pip install --no-cache-dir --no-index --no-deps /tmp/longhaul-dist/longhaul-*.whl \
    && rm -rf /tmp/longhaul-dist

LABEL org.opencontainers.image.title="longhaul-trainer" \
      org.opencontainers.image.description="longhaul GRPO trainer (veRL, vLLM) with baked models; runs offline" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.longhaul.stack="${STACK}"

USER 1000:1000
WORKDIR /home/longhaul
# `longhaul launch` (the in-container supervisor) by default; any other subcommand by argument, e.g.
#   podman run --rm IMAGE models check /etc/longhaul/experiment.yaml
ENTRYPOINT ["longhaul"]
CMD ["launch"]
