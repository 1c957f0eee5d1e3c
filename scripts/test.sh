#!/usr/bin/env bash
# The README's test command. Installs what the tests need (idempotent: test servers and Python
# packages, NVRTC from PyPI for the kernel compile check), then runs every Rust test (CPU; device
# tests skip without a GPU), the CLI smoke test of the stages, and the end-to-end server tests
# (openai SDK against the real binary).
set -euo pipefail
cd "$(dirname "$0")/.."
# Python packages go into the repository's own virtual environment (scripts/venv.sh).
venv_bin="$(bash scripts/venv.sh)"
export PATH="$venv_bin:$PATH" VIRTUAL_ENV="$(dirname "$venv_bin")"
bash scripts/ci-deps-stages.sh
bash scripts/ci-deps-serve.sh
eval "$(bash scripts/ci-deps-cuda.sh)"
cargo build --workspace
cargo test --workspace
# DGX Spark is aarch64: the workspace must check for it (skipped, with the reason, where the
# cross toolchain cannot be installed: exit status 3 of the deps script).
rc=0
aarch64_env="$(bash scripts/ci-deps-aarch64.sh)" || rc=$?
if [ "$rc" = 0 ]; then
    (eval "$aarch64_env" && cargo check --workspace --target aarch64-unknown-linux-gnu)
elif [ "$rc" != 3 ]; then
    exit "$rc"
fi
# Every kernel within GB10's limits for what the launches ask (docs/design/gb10.md).
"$PWD/target/debug/laguna" warmup --arch sm_121a --audit
bash tests/stages/cli-smoke.sh "$PWD/target/debug/laguna" "$PWD/target/debug/laguna-dev"
LAGUNA_BIN="$PWD/target/debug/laguna" python3 -m pytest -q tests/serve
