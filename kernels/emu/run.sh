#!/usr/bin/env bash
# Builds kernels/cu sources as C++ with the CPU emulation in cuda_emu.h and runs the emulated
# kernel tests (moe_block.cpp, invariance.cpp, attention.cpp, attention_tc.cpp, moe_gemm.cpp, widths.cpp). Needs g++ with C++20 (std::barrier). Usage:
#   kernels/emu/run.sh [build dir]      (default: a temporary directory, removed afterwards)
# Exit status 0 = every test passed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cu="$here/../cu"
out="${1:-}"
if [ -z "$out" ]; then
    out="$(mktemp -d)"
    trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
# A module's files in program order, as kernels/src/lib.rs registers them (a test there checks
# that the lists agree).
files() {
    case "$1" in
    attention) echo attention/common.cuh attention/qk_rope.cu attention/decode.cu attention/merge.cu attention/prefill.cu attention/decode_tc.cu ;;
    moe) echo moe/router.cu moe/experts.cu moe/experts_warp.cu moe/experts_tc.cu moe/decode_fused.cu ;;
    *) echo "$1.cu" ;;
    esac
}
# One translation unit: the shared helpers, then the modules whose kernels the tests launch.
# `extern __shared__ T name[]` (dynamic shared memory) becomes `extern T name[]`: the test
# defines those arrays, one copy per emulated block (process).
{
    cat "$cu/common.cuh"
    for m in norm linear moe gemm attention sample; do
        for f in $(files "$m"); do
            echo "#line 1 \"$f\""
            sed 's/extern __shared__ /extern /' "$cu/$f"
        done
    done
} > "$out/kernels.inc"
status=0
for t in moe_block invariance attention attention_tc moe_gemm widths; do
    g++ -std=c++20 -O1 -ffp-contract=off -pthread -w -I"$out" -I"$here" "$here/$t.cpp" -o "$out/$t"
    "$out/$t" || status=1
done
exit $status
