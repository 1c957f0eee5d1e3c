#!/usr/bin/env bash
# One device call that A/Bs two builds and runs the checks of the open issues. Logs under $OUT.
# Usage (device machine, repo root): scripts/device-session.sh PART
#   ab      before (dist/laguna-before) vs after (dist/laguna): device-test on the fixtures, the
#           XS-2.1 DFlash pair, and the 2K bench (decode graph, TTFT, greedy fingerprint),
#           alternating builds for ROUNDS rounds.
#   checks  after only: the random-config sweep (SWEEP_N configs from SWEEP_SEED), the fixture
#           checks of scripts/device-check.sh, bench --agent-replay, bench --grammar.
# Needs dist/laguna, dist/laguna-before, and dist/cache.tar.zst (cubins of both builds).
set -u
PART="${1:-ab}"
OUT="${OUT:-/tmp/laguna-out}"
mkdir -p "$OUT"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/laguna-cache}"
mkdir -p "$XDG_CACHE_HOME"
[ -f dist/cache.tar.zst ] && [ ! -e "$XDG_CACHE_HOME/.unpacked" ] && \
    tar -C "$XDG_CACHE_HOME" --zstd -xf dist/cache.tar.zst && touch "$XDG_CACHE_HOME/.unpacked"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
A=dist/laguna; B=dist/laguna-before
M=/tmp/xs21-synth; D=/tmp/xs21-dflash-synth
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
synth() {
    [ -f "$M/config.json" ] || "$A" synth --config tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json --out "$M" > "$OUT/synth.log" 2>&1
    [ -f "$D/config.json" ] || "$A" synth --config tests/fixtures/reference/laguna-xs-2.1-dflash.config.json --out "$D" > "$OUT/synth-d.log" 2>&1
}
row() { grep -E "$1" "$2" | head -1; }
if [ "$PART" = ab ]; then
    for b in "$B" "$A"; do n=$(basename "$b"); timeout 300 "$b" warmup > "$OUT/warmup-$n.log" 2>&1; echo "warmup $n: rc $? $(tail -1 "$OUT/warmup-$n.log")"; done
    synth &
    SY=$!
    for b in "$B" "$A"; do
        n=$(basename "$b")
        timeout 240 "$b" device-test --fixtures tests/fixtures/models --no-dflash > "$OUT/dt-$n.log" 2>&1
        echo "device-test $n: rc $? ($(grep -c 'OK |' "$OUT/dt-$n.log") OK rows, $(grep -c 'FAIL |' "$OUT/dt-$n.log") FAIL rows)"
    done
    # Same bits: the per-fixture error columns must be equal between the builds.
    diff <(grep -E '^\|' "$OUT/dt-laguna-before.log" | cut -d'|' -f2-6) <(grep -E '^\|' "$OUT/dt-laguna.log" | cut -d'|' -f2-6) > "$OUT/dt-diff.txt" \
        && echo "device-test rows: identical" || { echo "device-test rows DIFFER:"; head -20 "$OUT/dt-diff.txt"; }
    wait $SY
    for b in "$B" "$A"; do
        n=$(basename "$b")
        timeout 200 "$b" device-test --dflash-pair "$D,$M" > "$OUT/pair-$n.log" 2>&1
        echo "dflash pair $n: rc $? $(grep -E 'verify-bitwise' "$OUT/pair-$n.log" | head -2 | tr '\n' ' ')"
    done
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for b in "$B" "$A"; do
            n=$(basename "$b"); f="$OUT/bench-$n-$r.log"
            timeout 150 "$b" bench --model "$M" --prompt-len 2048 --gen "${GEN:-64}" --runs "${RUNS:-3}" > "$f" 2>&1
            echo "[$n] round $r: rc $? $(row '^\| decode graph' "$f") $(row '^\| decode \(median' "$f") $(row '^\| TTFT' "$f") $(row '^\| greedy tokens' "$f")"
        done
    done
fi
if [ "$PART" = checks ]; then
    timeout 60 "$A" warmup > "$OUT/warmup.log" 2>&1
    synth
    if [ -n "${SWEEP_N:-}" ]; then
        timeout "${SWEEP_TIMEOUT:-300}" "$A" device-test --random-configs "$SWEEP_N" --seed "${SWEEP_SEED:-1}" --keep-failures "$OUT/sweep-failures" > "$OUT/sweep.log" 2>&1
        echo "sweep: rc $?"; tail -25 "$OUT/sweep.log"
    fi
    if [ -n "${REPLAY:-}" ]; then
        timeout 240 "$A" bench --model "$M" --agent-replay > "$OUT/replay.log" 2>&1
        echo "agent replay: rc $?"; grep -E '^\|' "$OUT/replay.log" | tail -14
    fi
    if [ -n "${GRAMMAR:-}" ]; then
        timeout 120 "$A" bench --model "$M" --grammar --prompt-len 512 --gen 128 > "$OUT/grammar.log" 2>&1
        echo "grammar: rc $?"; grep -E '^\|' "$OUT/grammar.log" | tail -10
    fi
    if [ -n "${FIXTURES:-}" ]; then
        LAGUNA_BIN="$A" NO_BENCH=1 OUT="$OUT/check" timeout 420 bash scripts/device-check.sh fixtures > "$OUT/check.log" 2>&1
        echo "device-check fixtures: rc $?"; tail -12 "$OUT/check.log"
    fi
fi
