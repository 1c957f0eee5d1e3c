#!/usr/bin/env bash
# The README's test command. Installs what the tests need (Python packages, test servers, NVRTC
# for the kernel compile check; each scripts/ci-deps-*.sh is idempotent), then runs every Rust
# test (CPU; device tests skip without a GPU) and the end-to-end server tests (openai SDK against
# the real binary).
set -euo pipefail
cd "$(dirname "$0")/.."
for s in scripts/ci-deps-*.sh; do
  [ -f "$s" ] || continue
  echo "== $s"
  # shellcheck disable=SC1090
  source "$s"
done
cargo build --workspace
cargo test --workspace
if [ -d tests/serve ]; then
  LAGUNA_BIN="$PWD/target/debug/laguna" python3 -m pytest -q tests/serve
fi
