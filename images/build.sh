#!/usr/bin/env bash
# Build or export the longhaul images with podman (default), buildah or docker.
#   images/build.sh trainer  [VAR=VALUE ...]   build the trainer image (root Dockerfile)
#   images/build.sh operator [VAR=VALUE ...]   build the operator image (images/operator.Dockerfile)
#   images/build.sh export   IMAGE OUT.tar     save IMAGE as a docker-archive (input of `apptainer build`)
# Variables (environment or VAR=VALUE arguments):
#   STACK          trainer stack: cuda13 (default), cpu-min (images/stacks/)
#   IMAGE          tag (default localhost/longhaul-trainer:<STACK> / localhost/longhaul-operator:dev)
#   BUILDER_IMAGE, BASE_IMAGE   override the stack's bases (images/stacks/<STACK>/stack.env)
#   MODEL_SRC      hub (default) or local; LOCAL_MODELS (context directory, default build/models)
#   POLICY_MODEL, POLICY_REVISION, SIMULATOR_MODEL, SIMULATOR_REVISION   models to bake (MODEL_SRC=hub)
#   HF_TOKEN_FILE  file holding a Hugging Face token, passed as the build secret `hf_token`
#   HF_ENDPOINT    a Hub mirror for MODEL_SRC=hub; BUILD_NETWORK=host lets RUN steps reach one on 127.0.0.1
#   ENGINE         podman | buildah | docker (default: podman if installed, else docker)
#   PYTHON         interpreter for images/wheelhouse.sh; SKIP_WHEELHOUSE=1 uses build/wheelhouse as it is
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
what=${1:?usage: images/build.sh trainer|operator|export ...}
shift
if [ "$what" = export ]; then
  image=${1:?usage: images/build.sh export IMAGE OUT.tar}
  out=${2:?usage: images/build.sh export IMAGE OUT.tar}
  mkdir -p "$(dirname "$out")"
  rm -f "$out"
  if command -v podman >/dev/null 2>&1 && [ "${ENGINE:-podman}" != docker ]; then
    podman save --format docker-archive -o "$out" "$image"
  else
    docker save -o "$out" "$image"
  fi
  echo "wrote $out ($(du -h "$out" | cut -f1)); on the cluster: apptainer build trainer.sif docker-archive:$(basename "$out")"
  exit 0
fi
for kv in "$@"; do
  [[ $kv == *=* ]] || { echo "expected VAR=VALUE, got '$kv'" >&2; exit 2; }
  export "${kv?}"
done

case $what in
  trainer)
    STACK=${STACK:-cuda13}
    file=Dockerfile
    IMAGE=${IMAGE:-localhost/longhaul-trainer:$STACK} ;;
  operator)
    STACK=operator
    file=images/operator.Dockerfile
    IMAGE=${IMAGE:-localhost/longhaul-operator:dev} ;;
  *) echo "unknown target '$what'; valid: trainer, operator, export" >&2; exit 2 ;;
esac
if [ ! -f "images/stacks/$STACK/stack.env" ]; then
  echo "unknown STACK '$STACK'; valid: $(cd images/stacks && echo */ | tr -d /)" >&2
  exit 2
fi
stack_builder=$(sed -n 's/^BUILDER_IMAGE=//p' "images/stacks/$STACK/stack.env")
stack_base=$(sed -n 's/^BASE_IMAGE=//p' "images/stacks/$STACK/stack.env")
BUILDER_IMAGE=${BUILDER_IMAGE:-$stack_builder}
BASE_IMAGE=${BASE_IMAGE:-$stack_base}

if [ "${SKIP_WHEELHOUSE:-0}" != 1 ]; then
  bash images/wheelhouse.sh "$STACK"
fi

args=(--build-arg "BUILDER_IMAGE=$BUILDER_IMAGE" --build-arg "BASE_IMAGE=$BASE_IMAGE")
if [ "$what" = trainer ]; then
  args+=(--build-arg "STACK=$STACK" --build-arg "MODEL_SRC=${MODEL_SRC:-hub}")
  for v in LOCAL_MODELS POLICY_MODEL POLICY_REVISION SIMULATOR_MODEL SIMULATOR_REVISION HF_ENDPOINT; do
    if [ -n "${!v:-}" ]; then args+=(--build-arg "$v=${!v}"); fi
  done
  if [ -n "${HF_TOKEN_FILE:-}" ]; then args+=(--secret "id=hf_token,src=$HF_TOKEN_FILE"); fi
fi

if [ -n "${BUILD_NETWORK:-}" ]; then args+=(--network "$BUILD_NETWORK"); fi

engine=${ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
start=$(date +%s)
case $engine in
  # docker format keeps SHELL and HEALTHCHECK (OCI image configs cannot carry them).
  podman) podman build --format docker --layers -f "$file" -t "$IMAGE" "${args[@]}" . ;;
  buildah) buildah bud --format docker --layers -f "$file" -t "$IMAGE" "${args[@]}" . ;;
  docker) DOCKER_BUILDKIT=1 docker build -f "$file" -t "$IMAGE" "${args[@]}" . ;;
  *) echo "unknown ENGINE '$engine'; valid: podman, buildah, docker" >&2; exit 2 ;;
esac
echo "built $IMAGE ($what, stack $STACK) in $(($(date +%s) - start)) s"
