#!/usr/bin/env bash
# Make `cargo check --target aarch64-unknown-linux-gnu` possible on an x86-64 machine (DGX Spark
# is aarch64; docs/design/gb10.md): the Rust target through rustup, a C cross compiler for the
# crates that build C (onig_sys for tokenizers, ring for rustls) through apt. Idempotent. Prints
# the environment to export, like scripts/ci-deps-cuda.sh. Usage:
#   if env="$(bash scripts/ci-deps-aarch64.sh)"; then eval "$env"; cargo check --target ...; fi
# Exit status: 0 ready; 3 skipped (no rustup, no root or no apt: the reason on stderr);
# anything else is a failure.
set -euo pipefail
TARGET=aarch64-unknown-linux-gnu
CC_BIN=aarch64-linux-gnu-gcc
skip() {
    echo "ci-deps-aarch64.sh: skipping the aarch64 check: $*" >&2
    exit 3
}
command -v rustup >/dev/null || skip "rustup is not installed (cannot add the $TARGET target)"
if ! rustup target list --installed | grep -qx "$TARGET"; then
    rustup target add "$TARGET" >&2
fi
if ! command -v "$CC_BIN" >/dev/null; then
    command -v apt-get >/dev/null || skip "$CC_BIN is missing and there is no apt-get to install gcc-aarch64-linux-gnu"
    [ "$(id -u)" = 0 ] || skip "$CC_BIN is missing and installing gcc-aarch64-linux-gnu needs root"
    if ! apt-get install -y -q gcc-aarch64-linux-gnu >&2; then
        apt-get update -q >&2
        apt-get install -y -q gcc-aarch64-linux-gnu >&2
    fi
fi
echo "export CC_aarch64_unknown_linux_gnu=$CC_BIN"
echo "export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar"
echo "export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=$CC_BIN"
