#!/usr/bin/env bash
# The README's test command: every Rust test (CPU; device tests skip without a GPU), then the
# end-to-end server tests with the official openai SDK against the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace
cargo test --workspace 2>&1 | tee /tmp/laguna-cargo-test.log
if [ -d tests/serve ]; then
  LAGUNA_BIN="$PWD/target/debug/laguna" python3 -m pytest -q tests/serve
fi
