#!/usr/bin/env bash
# Everything that needs the GPU, in one device call: kernel warmup (cache hit when dist/cache was
# carried), CUDA-vs-CPU checks on every fixture, then a random-weight checkpoint of the real
# Laguna-XS 2.1 shape and the decode/TTFT bench on it. Logs under $OUT; short table last.
# Usage (device machine, repo root): scripts/device-check.sh [fixtures|bench|all] (default all)
# Env: SWEEP_K=1..15 (also synthesize the XS-2.1 DFlash draft and time DFlash steps for these k),
# DEVICE_TEST_ARGS (e.g. --only-dflash), PROMPT_LEN, GEN, RUNS, BENCH_ARGS.
# Needs dist/laguna (release build, carried) and optionally dist/cache (precompiled cubins).
set -u
WHAT="${1:-all}"
OUT="${OUT:-/tmp/laguna-out}"
mkdir -p "$OUT"
BIN="${LAGUNA_BIN:-dist/laguna}"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/dist/cache}"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
status_warm=skip; status_fix=skip; status_bench=skip
"$BIN" warmup 2>&1 | tee "$OUT/warmup.log" | tail -3 && status_warm=ok || status_warm=FAIL
if [ "$WHAT" = all ] || [ "$WHAT" = fixtures ]; then
    timeout 400 "$BIN" device-test --fixtures tests/fixtures/models ${DEVICE_TEST_ARGS:-} > "$OUT/device-test.log" 2>&1 && status_fix=ok || status_fix=FAIL
    cat "$OUT/device-test.log"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
    M=/tmp/xs21-synth
    [ -f "$M/config.json" ] || timeout 300 "$BIN" synth --config tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json --out "$M" 2>&1 | tee "$OUT/synth.log"
    DRAFT_ARGS=""
    if [ -n "${SWEEP_K:-}" ]; then
        D=/tmp/xs21-dflash-synth
        [ -f "$D/config.json" ] || timeout 300 "$BIN" synth --config tests/fixtures/reference/laguna-xs-2.1-dflash.config.json --out "$D" 2>&1 | tee "$OUT/synth-draft.log"
        DRAFT_ARGS="--draft $D --sweep-k $SWEEP_K"
    fi
    timeout 500 "$BIN" bench --model "$M" --prompt-len "${PROMPT_LEN:-2048}" --gen "${GEN:-256}" --runs "${RUNS:-3}" $DRAFT_ARGS ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1 && status_bench=ok || status_bench=FAIL
    cat "$OUT/bench.log" | grep -v "^\s*$" | tail -60
fi
echo
echo "| step | result |"
echo "|---|---|"
echo "| warmup | $status_warm |"
echo "| device-test (fixtures) | $status_fix |"
echo "| bench (synthetic XS-2.1) | $status_bench |"
grep -E "^\| (decode|TTFT|roofline|bytes per|copy|load) " "$OUT/bench.log" 2>/dev/null || true
