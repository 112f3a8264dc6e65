#!/usr/bin/env bash
# Download pinned model revisions into a Hugging Face cache at image build time (the models-hub stage).
# Usage: bake-models.sh HF_HOME REPO REVISION [REPO REVISION ...]
#   REVISION must be a 40-hex commit: a branch would make the image depend on when it was built.
# After the download, refs/main of each repo points at the pinned commit, so the model also resolves offline
# by name alone (HF_HUB_OFFLINE=1, revision null in the spec). A token, if needed, comes from the build
# secret `hf_token` (mounted at /run/secrets/hf_token for one RUN step and read via HF_TOKEN_PATH).
set -euo pipefail

if (($# < 3 || ($# - 1) % 2)); then
  echo "usage: bake-models.sh HF_HOME REPO REVISION [REPO REVISION ...]" >&2
  exit 2
fi
export HF_HOME=$1
shift
export HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_OFFLINE=0
if [ -z "${HF_ENDPOINT:-}" ]; then
  unset HF_ENDPOINT # empty = the public Hub (an empty value would break huggingface_hub's URLs)
fi
if [ -r /run/secrets/hf_token ]; then
  export HF_TOKEN_PATH=/run/secrets/hf_token
fi

while (($#)); do
  repo=$1 rev=$2
  shift 2
  if ! [[ $rev =~ ^[0-9a-f]{40}$ ]]; then
    echo "bake-models: $repo: revision '$rev' is not a 40-hex commit; pin one (the model page's 'Files' history)" >&2
    exit 2
  fi
  # Consolidated/original checkpoints duplicate the safetensors weights; vLLM and transformers use neither.
  hf download "$repo" --revision "$rev" --exclude "original/*" --exclude "*.pth" --exclude "*.pt" >/dev/null
  refs="$HF_HOME/hub/models--${repo//\//--}/refs"
  mkdir -p "$refs"
  printf '%s' "$rev" >"$refs/main"
  echo "baked $repo@$rev"
done
rm -rf "$HF_HOME/hub/.locks" "$HF_HOME"/.check_for_*
# Apptainer and Charliecloud ignore USER and run as the calling user: everything must be world-readable.
chmod -R a+rX "$HF_HOME"
