#!/usr/bin/env bash
# Everything that needs the GPU, in one device call: kernel warmup (cache hit when dist/cache was
# carried), CUDA-vs-CPU checks on every fixture, then a random-weight checkpoint of the real
# Laguna-XS 2.1 shape and the decode/TTFT bench on it. Logs under $OUT; short table last.
# Usage (device machine, repo root): scripts/device-check.sh [fixtures|bench|all] (default all)
# Env: SWEEP_K=1..15 (also synthesize the XS-2.1 DFlash draft, check DFlash on that pair with
# `laguna-dev device-test --dflash-pair`, and time DFlash steps for these k),
# DEVICE_TEST_ARGS (e.g. --only-dflash), PROMPT_LEN, GEN, RUNS, BENCH_ARGS, NO_BENCH=1 (skip the 2K
# bench), LONG=262000 (also the long-context run with a 12 GiB K/V budget; LONG_ARGS, LONG_TIMEOUT).
# Needs dist/laguna and dist/laguna-dev (release builds, carried; build them off the device:
#   cargo build --release -p laguna-cli -p laguna-dev && mkdir -p dist &&
#   cp target/release/laguna target/release/laguna-dev dist/ && strip dist/laguna dist/laguna-dev)
# and optionally dist/cache (precompiled cubins). LAGUNA_BIN names another `laguna`; `laguna-dev`
# is taken from the same folder.
set -u
WHAT="${1:-all}"
OUT="${OUT:-/tmp/laguna-out}"
mkdir -p "$OUT"
BIN="${LAGUNA_BIN:-dist/laguna}"
DEV="$(dirname "$BIN")/laguna-dev"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/dist/cache}"
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
status_warm=skip; status_fix=skip; status_bench=skip; status_long=skip
"$BIN" warmup 2>&1 | tee "$OUT/warmup.log" | tail -3 && status_warm=ok || status_warm=FAIL
if [ "$WHAT" = all ] || [ "$WHAT" = fixtures ]; then
    timeout 400 "$DEV" device-test --fixtures tests/fixtures/models ${DEVICE_TEST_ARGS:-} > "$OUT/device-test.log" 2>&1 && status_fix=ok || status_fix=FAIL
    cat "$OUT/device-test.log"
fi
status_cli=skip
status_samp=skip
status_pair=skip
if [ "$WHAT" = all ] || [ "$WHAT" = fixtures ]; then
    # DFlash on the GPU through the CLI (device-resident loop) and the server (scheduler + the
    # driver, greedy batches fused into device steps): same tokens as without the draft, counters move.
    P=tests/fixtures/models/swa-yarn-perhead; D=tests/fixtures/drafts/swa-yarn-perhead-causal-w8; DEV=${DFLASH_DEVICE:-cuda}
    IDS=5,6,7,8,9,10,11,12,13,14,15,16
    (
        A=$("$BIN" generate --model $P --device $DEV --prompt-ids $IDS --max-tokens 32 --ignore-eos --json | tail -1)
        B=$("$BIN" generate --model $P --device $DEV --draft $D --num-speculative-tokens 6 --prompt-ids $IDS --max-tokens 32 --ignore-eos --json | tail -1)
        echo "no draft: $A"; echo "draft:    $B"
        CA=$(echo "$A" | python3 -c 'import json,sys; print(json.load(sys.stdin)["completion_ids"])')
        CB=$(echo "$B" | python3 -c 'import json,sys; print(json.load(sys.stdin)["completion_ids"])')
        [ "$CA" = "$CB" ] && echo "generate --draft on $DEV: identical" || { echo "generate --draft on $DEV: DIFFERENT"; exit 1; }
        # The server needs a tokenizer: the target fixture plus tiny-chat's (ids stay below its vocab).
        T=$(mktemp -d); cp $P/config.json $P/model.safetensors $T/; cp tests/fixtures/models/tiny-chat/tokenizer.json $T/
        for mode in plain dflash; do
            EXTRA=""; [ $mode = dflash ] && EXTRA="--draft $D --num-speculative-tokens 3"
            "$BIN" serve --model $T --device $DEV --served-model-name t --max-num-batched-tokens 16 --port 18123 $EXTRA > "$OUT/serve-$mode.log" 2>&1 &
            SP=$!
            for i in $(seq 1 120); do curl -sf localhost:18123/health > /dev/null && break; sleep 0.5; done
            # 4 concurrent prompts in one request: verify rows of several sequences share passes.
            curl -sf localhost:18123/v1/completions -H 'content-type: application/json' \
                -d '{"prompt": [[3,10,17,24,31,38],[34,41,48,55,62,69,76,83,90],[65,72,79,86,93,100,107,114,121,128,135,142],[96,103,110,117,124,131,138,145,152,159,166,173,180,187,194]], "max_tokens": 20, "temperature": 0, "ignore_eos": true}' > "$OUT/serve-$mode.json"
            curl -sf localhost:18123/metrics | grep -E '^vllm:spec_decode_num_(drafts|accepted_tokens)_total' > "$OUT/serve-$mode.metrics"
            kill $SP; wait $SP 2>/dev/null
            echo "$mode: $(cat $OUT/serve-$mode.json | cut -c1-200)"; cat "$OUT/serve-$mode.metrics"
        done
        python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
a, b = (json.load(open(f"{o}/serve-{m}.json")) for m in ("plain", "dflash"))
ta, tb = ([c["text"] for c in r["choices"]] for r in (a, b))
assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"] == 80, (a["usage"], b["usage"])
assert ta == tb, (ta, tb)
m = open(f"{o}/serve-dflash.metrics").read()
drafts = [float(l.split()[-1]) for l in m.splitlines() if l.startswith("vllm:spec_decode_num_drafts_total")]
assert drafts and drafts[0] > 0, m
print("serve --draft on cuda: identical to serving without the draft; drafts", drafts[0])
PY
    ) > "$OUT/dflash-cli.log" 2>&1 && status_cli=ok || status_cli=FAIL
    tail -8 "$OUT/dflash-cli.log"
    # Sampling through the server on the GPU: three concurrent seeded requests (T 0.8, top-p 0.9;
    # batched into pipelined device decode steps, tokens drawn on the GPU; 16, 20 and 24 tokens,
    # so sequences finish while others go on) give exactly the text `laguna generate` gives for
    # each prompt and seed alone.
    (
        P=tests/fixtures/models/swa-yarn-perhead
        T=$(mktemp -d); cp $P/config.json $P/model.safetensors $T/; cp tests/fixtures/models/tiny-chat/tokenizer.json $T/
        "$BIN" serve --model $T --device cuda --served-model-name t --port 18124 > "$OUT/serve-sample.log" 2>&1 &
        SP=$!; CP=""
        for i in $(seq 1 120); do curl -sf localhost:18124/health > /dev/null && break; sleep 0.5; done
        for j in 1 2 3; do
            IDS=$(python3 -c "print([($j * 7 + 3 * i) % 200 + 5 for i in range(9 + $j)])")
            curl -sf localhost:18124/v1/completions -H 'content-type: application/json' \
                -d "{\"prompt\": $IDS, \"max_tokens\": $((12 + 4 * j)), \"temperature\": 0.8, \"top_p\": 0.9, \"seed\": $((100 + j)), \"ignore_eos\": true}" > "$OUT/serve-sample-$j.json" &
            CP="$CP $!"
        done
        for c in $CP; do wait $c; done
        kill $SP; wait $SP 2>/dev/null
        for j in 1 2 3; do
            IDS=$(python3 -c "print(','.join(str(($j * 7 + 3 * i) % 200 + 5) for i in range(9 + $j)))")
            "$BIN" generate --model $T --device cuda --prompt-ids $IDS --max-tokens $((12 + 4 * j)) --temperature 0.8 --top-p 0.9 --seed $((100 + j)) --ignore-eos --json | tail -1 > "$OUT/gen-sample-$j.json"
        done
        python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
for j in (1, 2, 3):
    s = json.load(open(f"{o}/serve-sample-{j}.json"))["choices"][0]["text"]
    g = json.load(open(f"{o}/gen-sample-{j}.json"))["text"]
    assert s == g, (j, s, g)
    print(f"seed {100 + j}: serve = generate ({len(s)} chars)")
print("sampled serving on cuda (device sampler, batched decode steps) = generate, per seed")
PY
    ) > "$OUT/sample-serve.log" 2>&1 && status_samp=ok || status_samp=FAIL
    tail -4 "$OUT/sample-serve.log"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
    M=/tmp/xs21-synth
    [ -f "$M/config.json" ] || timeout 300 "$DEV" synth --config tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json --out "$M" 2>&1 | tee "$OUT/synth.log"
    DRAFT_ARGS=""
    if [ -n "${SWEEP_K:-}" ]; then
        D=/tmp/xs21-dflash-synth
        [ -f "$D/config.json" ] || timeout 300 "$DEV" synth --config tests/fixtures/reference/laguna-xs-2.1-dflash.config.json --out "$D" 2>&1 | tee "$OUT/synth-draft.log"
        DRAFT_ARGS="--draft $D --sweep-k $SWEEP_K"
        # DFlash on the XS-2.1 shape itself (the fixtures are too small for its MoE forms, e.g.
        # moe_tc): verify rows bit-identical to decoded rows, DFlash tokens = greedy tokens.
        timeout 300 "$DEV" device-test --dflash-pair "$D,$M" > "$OUT/dflash-pair.log" 2>&1 && status_pair=ok || status_pair=FAIL
        grep -E "verify-bitwise|Error" "$OUT/dflash-pair.log"
    fi
    if [ "${NO_BENCH:-}" = "" ]; then
        timeout 500 "$BIN" bench --model "$M" --prompt-len "${PROMPT_LEN:-2048}" --gen "${GEN:-256}" --runs "${RUNS:-3}" $DRAFT_ARGS ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1 && status_bench=ok || status_bench=FAIL
        cat "$OUT/bench.log" | grep -v "^\s*$" | tail -60
    fi
    if [ -n "${LONG:-}" ]; then
        # Long context: a LONG-token prompt with the XS-2.1 recipe's 12 GiB K/V budget
        # (max_num_seqs 2), prefilled in passes of 8192 rows, then 64 decode steps.
        timeout "${LONG_TIMEOUT:-500}" "$BIN" bench --model "$M" --long-context --prompt-len "$LONG" --pool-gib 12 --max-seqs 2 --max-rows 8192 --gen 64 ${LONG_ARGS:-} > "$OUT/long.log" 2>&1 && status_long=ok || status_long=FAIL
        grep -v "^\s*$" "$OUT/long.log" | tail -12
    fi
fi
echo
echo "| step | result |"
echo "|---|---|"
echo "| warmup | $status_warm |"
echo "| device-test (fixtures) | $status_fix |"
echo "| DFlash CLI + server on cuda | $status_cli |"
echo "| sampled serving on cuda = generate | $status_samp |"
echo "| DFlash pair on the synthetic XS-2.1 (k=6, verify-bitwise) | $status_pair |"
echo "| bench (synthetic XS-2.1) | $status_bench |"
grep -E "^\| (decode|TTFT|roofline|bytes per|copy|load) " "$OUT/bench.log" 2>/dev/null || true
grep -E "^\| decode_step \(.*pipelined" "$OUT/bench.log" 2>/dev/null || true
echo "| long context (${LONG:-not run}) | $status_long |"
grep -E "^\| (TTFT|decode at|prompt) " "$OUT/long.log" 2>/dev/null || true
