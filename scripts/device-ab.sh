#!/usr/bin/env bash
# A/B of KernelSet variants in one device call: device-test (no DFlash) under each variant in
# DT_VARIANTS (default: none), with PAIR=1 also the XS-2.1 DFlash pair check
# (`device-test --dflash-pair`: verify rows bit for bit against decoded rows) under each, then
# the 2K bench under each variant in VARIANTS, ROUNDS times over to see run-to-run spread (each
# line: the graph's time a step, the serving path's `decode_step`, the roofline fractions, the
# bench's decode row, TTFT, the greedy fingerprint, the copy bandwidth). With STAMP_VARIANTS, a
# LAGUNA_STAMP=1 timeline of each (needs the cache to hold the STAMP build's cubins: warm it
# with LAGUNA_STAMP=1 laguna warmup). Logs under $OUT.
# Usage (device machine, repo root): VARIANTS="default +lm_argmax +gqa_lm" \
#   DT_VARIANTS="+lm_argmax,+gqa_lm" PAIR=1 GEN=128 scripts/device-ab.sh
# Env: GEN (default 32), RUNS (default 3), BENCH_ARGS, ROUNDS (default 2), DT_SHOW (fixture
# names whose device-test rows to print). Needs dist/laguna (+ dist/cache).
set -u
OUT="${OUT:-/tmp/laguna-out}"
mkdir -p "$OUT"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/dist/cache}"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
B="${LAGUNA_BIN:-dist/laguna}"
M=/tmp/xs21-synth
D=/tmp/xs21-dflash-synth
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
"$B" warmup > "$OUT/warmup.log" 2>&1 || { echo "warmup failed"; tail "$OUT/warmup.log"; exit 1; }
(
    "$B" synth --config tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json --out "$M" > "$OUT/synth.log" 2>&1
    if [ "${PAIR:-0}" = 1 ]; then
        "$B" synth --config tests/fixtures/reference/laguna-xs-2.1-dflash.config.json --out "$D" > "$OUT/synth-d.log" 2>&1
    fi
) &
SY=$!
for v in ${DT_VARIANTS:-}; do
    f="$OUT/dt${v//[,+]/_}.log"
    LAGUNA_KERNELS="$v" timeout 300 "$B" device-test --fixtures tests/fixtures/models --no-dflash > "$f" 2>&1
    echo "device-test [$v]: rc $? ($(grep -c 'OK |' "$f") OK rows, $(grep -c 'FAIL |' "$f") FAIL rows)"
    # Rows of the fixtures named in DT_SHOW (error values: equal across variants = same bits).
    for fx in ${DT_SHOW:-}; do grep -E "$fx" "$f" | head -8; done
done
wait $SY
if [ "${PAIR:-0}" = 1 ]; then
    for v in ${DT_VARIANTS:-default}; do
        f="$OUT/pair${v//[,+]/_}.log"
        LAGUNA_KERNELS="$v" timeout 300 "$B" device-test --dflash-pair "$D,$M" > "$f" 2>&1
        echo "dflash pair [$v]: rc $? $(grep -E 'verify-bitwise' "$f" | head -2 | tr '\n' ' ')"
    done
fi
row() { grep -E "$1" "$2" | head -1; }
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in ${VARIANTS:-default}; do
        f="$OUT/bench${v//[,+]/_}-$r.log"
        LAGUNA_KERNELS="$v" timeout 200 "$B" bench --model "$M" --prompt-len 2048 --gen "${GEN:-32}" --runs "${RUNS:-3}" ${BENCH_ARGS:-} > "$f" 2>&1
        echo "[$v] round $r: rc $? $(row '^\| decode graph' "$f") $(row '^\| decode_step \(greedy.*pipelined' "$f") $(grep -E '^\| roofline' "$f" | tr '\n' ' ') $(row '^\| decode \(median' "$f") $(row '^\| TTFT' "$f") $(row '^\| greedy tokens' "$f") $(row '^\| copy' "$f")"
    done
done
for v in ${STAMP_VARIANTS:-}; do
    f="$OUT/stamp${v//[,+]/_}.log"
    LAGUNA_STAMP=1 LAGUNA_KERNELS="$v" timeout 120 "$B" bench --model "$M" --prompt-len 2048 --gen 16 --runs 1 > "$f" 2>&1
    echo "stamp [$v]: rc $?"
    sed -n "/step span/,\$p" "$f" | head -14
done
