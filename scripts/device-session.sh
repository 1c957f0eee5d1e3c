#!/usr/bin/env bash
# The device checks of the open issues in one device call, most important first, each step
# bounded by what is left of BUDGET seconds (default 540). Logs under $OUT; a summary on stdout.
# Needs dist/laguna (release build) and dist/cache (cubins from `laguna warmup --arch sm_90a`).
# Steps: device-test on every fixture (CUDA vs CPU, DFlash pairs, prefix cache cached vs cold);
# the random-config sweep (SWEEP_N configs from SWEEP_SEED, SWEEP_ARGS); bench --agent-replay on
# the synthetic XS-2.1 shape; the XS-2.1 DFlash pair (verify bitwise) and prefix pair; bench
# --grammar; the 2K decode bench.
set -u
OUT="${OUT:-/tmp/laguna-out}"
mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=$(( T0 + ${BUDGET:-540} ))
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/dist/cache}"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
A=dist/laguna
M=/tmp/xs21-synth; D=/tmp/xs21-dflash-synth
# step NAME SECONDS CMD...: run CMD with at most SECONDS (or what is left), log to $OUT/NAME.log.
step() {
    local name=$1 want=$2; shift 2
    local left=$(( DEADLINE - $(date +%s) - 5 ))
    if [ "$left" -lt 20 ]; then echo "$name: skipped (no time left)"; return 1; fi
    [ "$want" -gt "$left" ] && want=$left
    timeout "$want" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc at $(( $(date +%s) - T0 )) s"
    return $rc
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
( "$A" synth --config tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json --out "$M" > "$OUT/synth.log" 2>&1
  "$A" synth --config tests/fixtures/reference/laguna-xs-2.1-dflash.config.json --out "$D" > "$OUT/synth-d.log" 2>&1 ) &
SY=$!
step warmup 120 "$A" warmup; tail -2 "$OUT/warmup.log"
step device-test 200 "$A" device-test --fixtures tests/fixtures/models
echo "  $(grep -c 'OK |' "$OUT/device-test.log") OK rows, $(grep -c 'FAIL |' "$OUT/device-test.log") FAIL rows"
grep -E "FAIL|ERROR|rror" "$OUT/device-test.log" | head -12
grep -iE "prefix" "$OUT/device-test.log" | head -8
if [ -n "${SWEEP_N:-}" ]; then
    step sweep "${SWEEP_SECS:-150}" "$A" device-test --random-configs "$SWEEP_N" --seed "${SWEEP_SEED:-0}" ${SWEEP_ARGS:-} --keep-failures "$OUT/sweep-failures"
    grep -vE "^\s*$" "$OUT/sweep.log" | tail -16
fi
wait $SY
step replay 120 "$A" bench --model "$M" --agent-replay
grep -E '^\|' "$OUT/replay.log" | tail -14; tail -3 "$OUT/replay.log"
step pair 60 "$A" device-test --dflash-pair "$D,$M"
grep -E 'verify-bitwise|rror' "$OUT/pair.log" | head -3
step prefix-pair 90 "$A" device-test --prefix-pair "$D,$M"
tail -6 "$OUT/prefix-pair.log"
# The grammar needs a tokenizer: tiny-chat's (539 tokens; ids past it are masked), so the mask
# cost measured is a lower bound of the real 100K-token vocabulary's.
cp tests/fixtures/models/tiny-chat/tokenizer.json tests/fixtures/models/tiny-chat/tokenizer_config.json "$M/"
step grammar 60 "$A" bench --model "$M" --grammar --prompt-len 2048 --gen 128 --runs 2
grep -E '^\|' "$OUT/grammar.log" | tail -8; tail -2 "$OUT/grammar.log"
step bench 60 "$A" bench --model "$M" --prompt-len 2048 --gen 64 --runs 3
grep -E '^\| (decode|TTFT|greedy|roofline|copy)' "$OUT/bench.log" | head -10
