#!/usr/bin/env bash
# The SASS of laguna's kernels as a GPU would run them, on a machine without a GPU: NVRTC 13.0
# builds the cubins (`laguna warmup --arch`), cuobjdump + nvdisasm from PyPI disassemble them.
# For each named kernel: its registers, then (without --full) only the lines that show where its
# memory round trips are: global loads (LDG, LDGSTS), shared loads, stores, the PDL wait
# (ACQBULK), barriers, exits, mma (HMMA) and shuffles. This is how PERF.md's "the SASS has ..."
# statements were read (sessions 32-33): a load issued after an instruction that waits on memory
# costs a second round trip.
#   scripts/sass.sh [--full] KERNEL...
# Env: LAGUNA (binary, default target/release/laguna, else target/debug/laguna), ARCH (sm_90a),
# SASS_CACHE (a cubin cache of this one build, default a temporary directory: the newest cubin of
# each module is read, so a cache holding a LAGUNA_STAMP build too would show that), SASS_TOOLS (the PyPI tools' folder,
# default ~/.cache/laguna/sass-tools).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
full=0
if [ "${1:-}" = "--full" ]; then
    full=1
    shift
fi
if [ $# -eq 0 ]; then
    echo "usage: scripts/sass.sh [--full] KERNEL...  (e.g. moe_block_1nprt attention_gqa_qk)" >&2
    exit 2
fi
LAGUNA="${LAGUNA:-}"
if [ -z "$LAGUNA" ]; then
    for b in "$here/../target/release/laguna" "$here/../target/debug/laguna"; do
        if [ -x "$b" ]; then
            LAGUNA="$b"
            break
        fi
    done
fi
if [ -z "$LAGUNA" ] || [ ! -x "$LAGUNA" ]; then
    echo "sass.sh: no laguna binary: build one (cargo build --release -p laguna-cli) or set LAGUNA" >&2
    exit 1
fi
ARCH="${ARCH:-sm_90a}"
TOOLS="${SASS_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/laguna/sass-tools}"
PY="${PYTHON:-python3}"
eval "$("$here/ci-deps-cuda.sh")"
BIN="$TOOLS/nvidia/cu13/bin"
if [ ! -x "$BIN/cuobjdump" ] || [ ! -x "$BIN/nvdisasm" ]; then
    # No 13.0 builds of these two on PyPI; any 13.x reads 13.0's cubins.
    "$PY" -m pip install --quiet --disable-pip-version-check --target "$TOOLS" \
        nvidia-cuda-cuobjdump==13.2.86 nvidia-cuda-nvdisasm==13.5.37 >&2
    chmod +x "$BIN/cuobjdump" "$BIN/nvdisasm" 2>/dev/null || true
fi
export PATH="$BIN:$PATH"
CACHE="${SASS_CACHE:-}"
if [ -z "$CACHE" ]; then
    CACHE="$(mktemp -d)"
    trap 'rm -rf "$CACHE"' EXIT
fi
XDG_CACHE_HOME="$CACHE" "$LAGUNA" warmup --arch "$ARCH" >&2
dir="$CACHE/laguna/kernels/$ARCH"
for k in "$@"; do
    found=0
    # The newest cubin of each module (a reused cache may hold older builds).
    for m in attention gemm linear moe norm sample; do
        c="$(ls -t "$dir/$m"-*.cubin 2>/dev/null | head -1)"
        [ -n "$c" ] || continue
        # (grep reads all of it: with -q the early exit would fail the pipeline under pipefail.)
        if cuobjdump -elf "$c" | grep "\.text\.$k\$" > /dev/null; then
            found=1
            regs="$(cuobjdump -res-usage "$c" 2>/dev/null | grep -A1 "Function $k:" | grep -o 'REG:[0-9]*' || true)"
            echo "== $k ($m, $ARCH, $regs)"
            if [ $full = 1 ]; then
                cuobjdump -sass -fun "$k" "$c"
            else
                cuobjdump -sass -fun "$k" "$c" |
                    grep -E 'LDG|LDGSTS|LDS|STS|STG|ST\.E|ACQBULK|BAR\.SYNC|EXIT|HMMA|SHFL|RED|ATOM' |
                    sed -e 's@/\* 0x[0-9a-f]* \*/@@' -e 's/  */ /g'
            fi
            break
        fi
    done
    if [ $found = 0 ]; then
        echo "sass.sh: no kernel named $k in the $ARCH cubins" >&2
        exit 1
    fi
done
