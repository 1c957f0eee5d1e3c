#!/usr/bin/env bash
# End-to-end smoke test of the `laguna` binary's stage commands (no network, no servers):
#   plan on the XS-2.1 recipe prints the independently derived pool; verify passes on a fixture
#   and fails, naming the file, on a cache-layout copy with one flipped byte; `laguna --help` lists
#   only user commands and `laguna-dev` the developer tools; a `laguna-dev synth` checkpoint of a
#   fixture's config passes verify and generates on the CPU.
# Usage: tests/stages/cli-smoke.sh [path/to/laguna [path/to/laguna-dev]]
#   (default: target/debug/laguna, and laguna-dev beside the laguna given)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
laguna="${1:-$root/target/debug/laguna}"
laguna_dev="${2:-$(dirname "$laguna")/laguna-dev}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out="$("$laguna" plan --recipe "$root/recipes/xs-nvfp4-dflash.toml" --device-memory 128GiB)"
echo "$out"
# num_speculative_tokens = "auto" plans for block_size 16 - 1 = 15: rings of 512 + 15 = 527 slots.
# (12 GiB - 2 seqs x (30 target + 5 x 5 draft) SWA ring layers x 527 slots x 4096 B) / 40,960 B/token, rounded down to 16
echo "$out" | grep -q "KV pool: 308,768 tokens, 1.18x of 262,144" || fail "plan pool line"
echo "$out" | grep -q "512 window + 15 speculative, auto's largest k" || fail "plan auto k"
echo "$out" | grep -q "40,960 B/token" || fail "plan KV bytes per token"
if "$laguna" plan --recipe "$root/recipes/xs-nvfp4-dflash.toml" --device-memory 48GiB >"$tmp/plan.txt" 2>&1; then
    fail "plan should refuse a 48 GiB device at gpu_memory_utilization 0.5"
fi
grep -q "gpu_memory_utilization" "$tmp/plan.txt" || fail "refusal names gpu_memory_utilization"

"$laguna" verify -q --model "$root/tests/fixtures/models/tied-sharded-gatingtrue" \
    --draft "$root/tests/fixtures/drafts/tied-sharded-gatingtrue-causal-w5" || fail "clean fixture"

# A cache-style snapshot: blobs named by SHA-256, relative links.
snap="$tmp/hub/models--org--tiny/snapshots/0123456789abcdef0123456789abcdef01234567"
mkdir -p "$snap" "$tmp/hub/models--org--tiny/blobs"
for f in "$root"/tests/fixtures/models/tied-sharded-gatingtrue/*; do
    sha="$(sha256sum "$f" | cut -d' ' -f1)"
    cp "$f" "$tmp/hub/models--org--tiny/blobs/$sha"
    ln -s "../../blobs/$sha" "$snap/$(basename "$f")"
done
"$laguna" verify -q --model "$snap" || fail "clean snapshot"
shard="$snap/model-00002-of-00002.safetensors"
blob="$(readlink -f "$shard")"
size=$(stat -c %s "$blob")
printf '\x5a' | dd of="$blob" bs=1 seek=$((size - 2)) conv=notrunc status=none
if "$laguna" verify -q --model "$snap" >"$tmp/verify.txt" 2>&1; then
    cat "$tmp/verify.txt"; fail "verify missed a flipped byte"
fi
grep -q "FAIL  model-00002-of-00002.safetensors" "$tmp/verify.txt" || { cat "$tmp/verify.txt"; fail "bad file not named"; }

# The product's help shows what users run; the developer tools live in laguna-dev.
"$laguna" --help >"$tmp/help.txt"
for c in generate serve fetch verify plan warmup bench; do
    grep -qE "^  $c " "$tmp/help.txt" || fail "laguna --help lacks $c"
done
if grep -qE "^  (synth|device-test|kbench) " "$tmp/help.txt"; then fail "laguna --help lists a developer tool"; fi
if "$laguna" synth --help >/dev/null 2>&1; then fail "laguna still has synth"; fi
"$laguna_dev" --help >"$tmp/dev-help.txt"
for c in synth device-test kbench; do
    grep -qE "^  $c " "$tmp/dev-help.txt" || fail "laguna-dev --help lacks $c"
done

# Random weights of a fixture's shape: verify checks them against the config's inventory, and the
# CPU engine loads them and generates.
"$laguna_dev" synth --config "$root/tests/fixtures/models/nvfp4-experts/config.json" --out "$tmp/synth" \
    || fail "laguna-dev synth"
"$laguna" verify -q --model "$tmp/synth" >"$tmp/synth-verify.txt" 2>&1 || { cat "$tmp/synth-verify.txt"; fail "verify of the synth checkpoint"; }
gen="$("$laguna" generate --model "$tmp/synth" --prompt-ids 1,2,3,4 --max-tokens 4 --ignore-eos --json | tail -1)"
echo "$gen" | grep -qE '"completion_ids":\[[0-9]+,[0-9]+,[0-9]+,[0-9]+\]' || fail "generate on the synth checkpoint: $gen"
# The device check needs a GPU; here only its arguments parse.
if ! "$laguna_dev" device-test --help >/dev/null; then fail "laguna-dev device-test --help"; fi
echo "cli-smoke: OK"
