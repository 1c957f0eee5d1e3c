#!/usr/bin/env bash
# The device checks of the open issues in one device call: the steps named in STEPS, in that
# order, each bounded by what is left of BUDGET seconds (default 540). Logs under $OUT; a summary
# on stdout. Needs dist/laguna and dist/laguna-dev (release builds) and dist/cache (cubins from
# `laguna warmup --arch sm_90a`); carry ["dist"]. Build off the device:
#   cargo build --release -p laguna-cli -p laguna-dev && mkdir -p dist &&
#   cp target/release/laguna target/release/laguna-dev dist/ && strip dist/laguna dist/laguna-dev
# Usage: STEPS="fixtures prefix grammar oracle" BUDGET=560 bash scripts/device-session.sh
# Steps:
#   fixtures  device-test on every fixture (CUDA vs CPU, DFlash pairs, sampling, prefix cache)
#   prefix    the prefix store seam bit for bit and the cached-vs-cold session, XS-2.1 synth pair
#   grammar   bench --grammar (mask cost per token; tiny-chat's tokenizer: a lower bound)
#   oracle    bench --acceptance: measured DFlash tok/s by accepted length and k, adaptive k
#   bench     the 2K decode/TTFT bench (greedy fingerprint)
#   gb10      device-test on the fixtures and the bench with its projection under --device-profile gb10
#   sweep     device-test --random-configs SWEEP_N (default 40) from SWEEP_SEED (default 0)
#   resume    bench --agent-resume 32768,131072 (cached turn vs new-token prefill)
#   replay    bench --agent-replay (8 turns, 8K to 64K)
#   ab        the same bench with dist/base/laguna (BASE, e.g. a build of the commit before a refactor)
#             and dist/laguna, alternating twice: fingerprint, decode and TTFT rows of each
#   kvrows    the DFlash k=6 step at 2K and 32K: does the verify's per-row K/V re-read reach DRAM?
#   nocublas  the first SWEEP_N (12) sweep seeds with LAGUNA_NO_CUBLAS=1
#   ttft      TTFT 2K of dist/base/laguna and dist/laguna, alternating three times
#   rows      DFlash steps at k = 7, 8, 12 with dist/base/laguna and dist/laguna (the GEMV's row tiles)
# Binaries may come gzipped (dist/NAME.gz, to stay under the carry limit): they are unpacked first.
# The base for `ab`: `git worktree add /tmp/base COMMIT`, a release build there, its stripped `laguna` as
# dist/base/laguna(.gz), and its cubins: `dist/base/laguna warmup --arch sm_90a --cache-dir dist/cache/laguna/kernels`.
set -u
OUT="${OUT:-/tmp/laguna-out}"
mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=$(( T0 + ${BUDGET:-540} ))
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/dist/cache}"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
for z in dist/*.gz dist/base/*.gz; do
    [ -f "$z" ] && { gunzip -c "$z" > "${z%.gz}"; chmod +x "${z%.gz}"; }
done
A=dist/laguna; DEV=dist/laguna-dev; BASE=dist/base/laguna
M=/tmp/xs21-synth; D=/tmp/xs21-dflash-synth
# run NAME SECONDS CMD...: run CMD with at most SECONDS (or what is left), log to $OUT/NAME.log.
run() {
    local name=$1 want=$2; shift 2
    local left=$(( DEADLINE - $(date +%s) - 5 ))
    if [ "$left" -lt 20 ]; then echo "$name: skipped (no time left)"; return 1; fi
    [ "$want" -gt "$left" ] && want=$left
    timeout "$want" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc at $(( $(date +%s) - T0 )) s"
    return $rc
}
synth() {
    [ -f "$M/config.json" ] || "$DEV" synth --config tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json --out "$M" > "$OUT/synth.log" 2>&1
    [ -f "$D/config.json" ] || "$DEV" synth --config tests/fixtures/reference/laguna-xs-2.1-dflash.config.json --out "$D" > "$OUT/synth-d.log" 2>&1
    cp tests/fixtures/models/tiny-chat/tokenizer.json tests/fixtures/models/tiny-chat/tokenizer_config.json "$M/"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
synth & SY=$!
run warmup 150 "$A" warmup; tail -1 "$OUT/warmup.log"
for s in ${STEPS:-fixtures prefix grammar oracle bench}; do
    case $s in
    fixtures)
        run fixtures 200 "$DEV" device-test --fixtures tests/fixtures/models
        echo "  $(grep -c 'OK |' "$OUT/fixtures.log") OK rows, $(grep -c 'FAIL |' "$OUT/fixtures.log") FAIL rows"
        grep -E "FAIL|ERROR|prefix cache" "$OUT/fixtures.log" | head -12 ;;
    prefix)
        wait $SY
        run prefix-store 120 "$DEV" device-test --prefix-store "$M"
        grep -E "prefix store|rror" "$OUT/prefix-store.log" | head -40
        run prefix-pair 150 "$DEV" device-test --prefix-pair "$D,$M"
        grep -E "prefix cache|rror" "$OUT/prefix-pair.log" | tail -4 ;;
    grammar)
        wait $SY
        run grammar 90 "$A" bench --model "$M" --grammar --prompt-len 2048 --gen 128 --runs 2
        grep -E '^\|' "$OUT/grammar.log" | tail -8; tail -2 "$OUT/grammar.log" ;;
    oracle)
        wait $SY
        run oracle 200 "$A" bench --model "$M" --draft "$D" --prompt-len 2048 --gen 64 --runs 1 \
            --acceptance 1,2,3,4,5,6,mean:1.4,mean:4.03 --spec-k ${ORACLE_K:-1,2,4,6,8,15,auto}
        grep -E '^\||step-time|oracle|rror|warn' "$OUT/oracle.log" | tail -70 ;;
    bench)
        wait $SY
        run bench 90 "$A" bench --model "$M" --prompt-len 2048 --gen 64 --runs 3
        grep -E '^\| (decode|TTFT|greedy|roofline|copy)|fnv|fingerprint' "$OUT/bench.log" | head -10 ;;
    gb10)
        wait $SY
        run gb10-fixtures 200 env LAGUNA_DEVICE_PROFILE=gb10 "$DEV" device-test --fixtures tests/fixtures/models --no-prefix
        echo "  $(grep -c 'OK |' "$OUT/gb10-fixtures.log") OK rows, $(grep -c 'FAIL |' "$OUT/gb10-fixtures.log") FAIL rows"
        grep -iE "FAIL|ERROR|profile|green" "$OUT/gb10-fixtures.log" | head -8
        run gb10-bench 200 "$A" --device-profile gb10 bench --model "$M" --draft "$D" --prompt-len 2048 --gen 64 --runs 2 --sweep-k 1..15
        grep -iE "profile|green|projection|^\||agree|DIFFER" "$OUT/gb10-bench.log" | tail -45 ;;
    sweep)
        run sweep 400 "$DEV" device-test --random-configs "${SWEEP_N:-40}" --seed "${SWEEP_SEED:-0}" --quick \
            --max-prompt 300 --gen-tokens 8 --keep-failures "$OUT/sweep-failures"
        grep -vE "^\s*$" "$OUT/sweep.log" | tail -14 ;;
    resume)
        wait $SY
        run resume 200 "$A" bench --model "$M" --agent-replay --agent-resume 32768,131072 --agent-new 2048
        grep -E '^\|' "$OUT/resume.log"; tail -2 "$OUT/resume.log" ;;
    replay)
        wait $SY
        run replay 150 "$A" bench --model "$M" --agent-replay
        grep -E '^\|' "$OUT/replay.log" | tail -14; tail -2 "$OUT/replay.log" ;;
    ab)
        wait $SY
        run warmup-base 200 "$BASE" warmup; tail -1 "$OUT/warmup-base.log"
        for i in 1 2; do
            for b in base main; do
                bin=$A; [ $b = base ] && bin=$BASE
                run ab-$b-$i 90 "$bin" bench --model "$M" --prompt-len 2048 --gen 64 --runs 3
                echo "  $b $i:"; grep -E '^\| (decode|TTFT|greedy)|fnv|fingerprint' "$OUT/ab-$b-$i.log" | head -6
            done
        done ;;
    nocublas)
        # The sweep's first seeds with laguna's own GEMMs instead of cuBLAS (the long passes).
        LAGUNA_NO_CUBLAS=1 run nocublas 200 "$DEV" device-test --random-configs "${SWEEP_N:-12}" --seed "${SWEEP_SEED:-0}" \
            --quick --max-prompt 300 --gen-tokens 8
        grep -E "^seed" "$OUT/nocublas.log" | sed -E 's/ \[L.*\]: / /' ;;
    ttft)
        # TTFT 2K alone, base and main alternating three times (5 runs each).
        wait $SY
        for i in 1 2 3; do
            for b in base main; do
                bin=$A; [ $b = base ] && bin=$BASE
                run ttft-$b-$i 60 "$bin" bench --model "$M" --prompt-len 2048 --gen 8 --runs 5
                echo "  $b $i: $(grep -E '^\| TTFT' "$OUT/ttft-$b-$i.log")"
            done
        done ;;
    rows)
        # The GEMV grids (row tiles side by side): DFlash steps of 8 (one row tile), 9 and 13 rows
        # with dist/base/laguna (row tiles in grid.y) and dist/laguna, alternating.
        wait $SY
        for b in base main; do
            bin=$A; [ $b = base ] && bin=$BASE
            run rows-$b 120 "$bin" bench --model "$M" --draft "$D" --sweep-k 7,8,12 --prompt-len 2048 --gen 64 --runs 1
            echo "  $b:"; grep -E '^\| [0-9]+ \|' "$OUT/rows-$b.log" | tail -6
        done ;;
    kvrows)
        wait $SY
        run kvrows-2k 150 "$A" bench --model "$M" --draft "$D" --sweep-k 6 --prompt-len 2048 --gen 64 --runs 1
        run kvrows-32k 250 "$A" bench --model "$M" --draft "$D" --sweep-k 6 --prompt-len 32768 --gen 64 --runs 1 \
            --pool-gib 12 --max-rows 8192
        for f in kvrows-2k kvrows-32k; do echo "  $f:"; grep -E '^\|' "$OUT/$f.log" | tail -12; done ;;
    *) echo "unknown step $s" ;;
    esac
done
wait
