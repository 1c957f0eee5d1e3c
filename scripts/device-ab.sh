#!/usr/bin/env bash
# A/B of KernelSet variants in one device call: device-test (no DFlash) under each variant in
# DT_VARIANTS (default: none), then the 2K bench (TTFT, decode, per-kernel prefill breakdown)
# under each variant in VARIANTS, twice over to see run-to-run spread. Logs under $OUT.
# Usage (device machine, repo root): VARIANTS="default -attn_q -attn_ex2,-attn_q" \
#   DT_VARIANTS="-attn_ex2" scripts/device-ab.sh
# Env: GEN (default 32), BENCH_ARGS, ROUNDS (default 2), DT_SHOW (fixture names whose device-test
# rows to print). Needs dist/laguna (+ dist/cache).
set -u
OUT="${OUT:-/tmp/laguna-out}"
mkdir -p "$OUT"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/dist/cache}"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
B="${LAGUNA_BIN:-dist/laguna}"
"$B" warmup > "$OUT/warmup.log" 2>&1 || { echo "warmup failed"; tail "$OUT/warmup.log"; exit 1; }
"$B" synth --config tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json --out /tmp/xs21-synth > "$OUT/synth.log" 2>&1 &
SY=$!
for v in ${DT_VARIANTS:-}; do
    f="$OUT/dt${v//[,+]/_}.log"
    LAGUNA_KERNELS="$v" timeout 300 "$B" device-test --fixtures tests/fixtures/models --no-dflash > "$f" 2>&1
    echo "device-test [$v]: rc $? ($(grep -c 'OK |' "$f") OK rows, $(grep -c 'FAIL |' "$f") FAIL rows)"
    # Rows of the fixtures named in DT_SHOW (error values: equal across variants = same bits).
    for fx in ${DT_SHOW:-}; do grep -E "$fx" "$f" | head -8; done
done
wait $SY
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in ${VARIANTS:-default}; do
        f="$OUT/bench${v//[,+]/_}-$r.log"
        LAGUNA_KERNELS="$v" timeout 200 "$B" bench --model /tmp/xs21-synth --prompt-len 2048 --gen "${GEN:-32}" --runs 3 ${BENCH_ARGS:-} > "$f" 2>&1
        echo "[$v] round $r: $(grep -E '^\| TTFT' "$f" | head -1) $(grep -E '^\| decode \(median' "$f" | head -1) $(grep -E '^\| greedy tokens' "$f" | head -1) $(grep -E '^\| kernels default set' "$f" | head -1)"
    done
done
