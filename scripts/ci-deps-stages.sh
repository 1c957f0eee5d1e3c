#!/usr/bin/env bash
# What the stage tests (stages/tests/fetch_*.rs) need on a fresh Debian machine:
# git (the olah mirror serves a git repo), nginx (Range/resume tests), olah (a real HF mirror).
# Idempotent: installs only what is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
need_apt=()
command -v git >/dev/null 2>&1 || need_apt+=(git)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
# g++ (C++20) builds the kernels as C++ for the emulated kernel tests (kernels/emu).
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo_cmd apt-get update -qq
    $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" \
        || $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]/nginx-light/nginx}"
fi
command -v olah-cli >/dev/null 2>&1 \
    || python3 -m pip install --quiet --disable-pip-version-check -r "$here/tests/stages/requirements.txt"
command -v olah-cli >/dev/null
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]
