#!/usr/bin/env bash
# Install NVRTC (+ CUDA headers) from PyPI so that kernels compile on a machine without a GPU or
# toolkit (CI), then print the environment to export. Usage:
#   eval "$(scripts/ci-deps-cuda.sh)"        # or: scripts/ci-deps-cuda.sh >> "$GITHUB_ENV" style
# Env: CUDA_PIP_TARGET (install folder, default ~/.cache/laguna/cuda-pip-13.0).
set -euo pipefail
TARGET="${CUDA_PIP_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/laguna/cuda-pip-13.0}"
PY="${PYTHON:-python3}"
# Pinned to CUDA 13.0, the NVRTC of the R580-driver machines (the lent H200, DGX Spark images):
# a newer NVRTC accepted code that 13.0 rejects (a generic lambda in device code), so CI compiles
# every kernel with the compiler the GPUs will run.
"$PY" -m pip install --quiet --disable-pip-version-check --target "$TARGET" \
    nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 >&2
ROOT="$TARGET/nvidia/cu13"
if [ ! -e "$ROOT/lib/libnvrtc.so.13" ]; then
    echo "ci-deps-cuda.sh: libnvrtc.so.13 not found under $ROOT/lib after install" >&2
    exit 1
fi
echo "export LD_LIBRARY_PATH=$ROOT/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export CUDA_HOME=$ROOT"
