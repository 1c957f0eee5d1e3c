#!/usr/bin/env bash
# Python packages the `laguna serve` end-to-end tests (tests/serve) need on a fresh machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -m pip install --quiet --disable-pip-version-check -r "$here/tests/serve/requirements.txt"
