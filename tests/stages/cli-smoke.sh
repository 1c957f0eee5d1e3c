#!/usr/bin/env bash
# End-to-end smoke test of the `laguna` binary's stage commands (no network, no servers):
#   plan on the XS-2.1 recipe prints the independently derived pool; verify passes on a fixture
#   and fails, naming the file, on a cache-layout copy with one flipped byte.
# Usage: tests/stages/cli-smoke.sh [path/to/laguna]   (default: target/debug/laguna)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
laguna="${1:-$root/target/debug/laguna}"
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
echo "cli-smoke: OK"
