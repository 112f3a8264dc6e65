# longhaul operator image: kopf handlers for the Experiment custom resource, with the longhaul package (spec,
# renderer) and its `operator` extra. No torch, veRL or vLLM. Build context: the repository root.
#
#   make image-operator        # CI: on the local Debian base (images/debian-base.sh)
#   podman build -f images/operator.Dockerfile -t REGISTRY/longhaul-operator:TAG .   # a connected site
#
# Runs as uid 1000 with a read-only root filesystem: Python writes no bytecode at run time (compiled at build
# time), HOME and TMPDIR point at /tmp, the only writable path it needs (mount an emptyDir there).
# Only Dockerfile 1.2 features (no `syntax` line, no heredocs); see the root Dockerfile.
ARG BUILDER_IMAGE=docker.io/library/debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251

# ---------------------------------------------------------------------------------------------------------
FROM ${BUILDER_IMAGE} AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INDEX=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
# build/wheelhouse/operator/ is made by `images/wheelhouse.sh operator`.
COPY build/wheelhouse/operator/ /wheelhouse/
COPY images/stacks/operator/ /stack/
COPY pyproject.toml images/project-requirements.py /stack/
RUN python3 /stack/project-requirements.py /stack/pyproject.toml --extras operator > /stack/project.txt \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheelhouse \
        -c /stack/constraints.txt -r /stack/project.txt -r /stack/requirements.txt

# ---------------------------------------------------------------------------------------------------------
FROM builder AS project
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY pyproject.toml README.m[d] /src/
COPY pipelines/ /src/pipelines/
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-index --find-links /wheelhouse --no-deps \
        --wheel-dir /dist /src

# ---------------------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && { getent group 1000 >/dev/null || echo "longhaul:x:1000:" >> /etc/group; } \
    && { getent passwd 1000 >/dev/null \
         || echo "longhaul:x:1000:1000:longhaul:/tmp:/usr/sbin/nologin" >> /etc/passwd; }
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_INDEX=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=builder /opt/venv /opt/venv
COPY operator/longhaul_operator.py /opt/longhaul/operator/
# Bytecode is compiled here (pip does it for the wheel) because the root filesystem is read-only at run time.
# COPY --from, not a bind mount from the stage (unreliable in buildah 1.28); the wheel is about 150 kB.
COPY --from=project /dist/ /tmp/longhaul-dist/
RUN pip install --no-cache-dir --no-index --no-deps /tmp/longhaul-dist/longhaul-*.whl \
    && rm -rf /tmp/longhaul-dist \
    && python3 -m compileall -q /opt/longhaul/operator

LABEL org.opencontainers.image.title="longhaul-operator" \
      org.opencontainers.image.description="longhaul Experiment operator (kopf); no ML stack" \
      org.opencontainers.image.licenses="Apache-2.0"

USER 1000:1000
WORKDIR /tmp
EXPOSE 8080
# The chart may replace the arguments (e.g. --namespace=X instead of --all-namespaces); keep the file last.
ENTRYPOINT ["kopf", "run"]
CMD ["--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "/opt/longhaul/operator/longhaul_operator.py"]
