#!/usr/bin/env bash
# The Python environment of the tests: a virtual environment at $LAGUNA_VENV (default .venv in the
# repository), so nothing is installed into the system Python (Debian refuses that: PEP 668). Works
# without python3-venv's ensurepip: the venv is then made --without-pip and pip is bootstrapped
# from its wheel on PyPI. Idempotent. Prints the venv's bin folder (prepend it to PATH).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LAGUNA_VENV:-$here/.venv}"
PIP_VERSION=24.3.1
if [ ! -x "$VENV/bin/python3" ]; then
    if [ -n "${LAGUNA_VENV_NO_ENSUREPIP:-}" ] || ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        python3 -m venv --without-pip "$VENV"
    fi
fi
if ! "$VENV/bin/python3" -m pip --version >/dev/null 2>&1; then
    "$VENV/bin/python3" - "$PIP_VERSION" "${PIP_INDEX_URL:-https://pypi.org/simple}" >&2 <<'PY'
import hashlib, os, re, subprocess, sys, tempfile, urllib.request
version, index_url = sys.argv[1], sys.argv[2].rstrip("/")
# PyPI's simple index (PEP 503): the wheel's URL with its sha256.
index = urllib.request.urlopen(index_url + "/pip/", timeout=30).read().decode()
m = re.search(r'href="([^"]*/pip-' + re.escape(version) + r'-py3-none-any\.whl)#sha256=([0-9a-f]+)"', index)
if not m:
    sys.exit(f"venv.sh: pip {version} not found on PyPI's simple index")
url, sha = m.groups()
data = urllib.request.urlopen(url, timeout=60).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit("venv.sh: the pip wheel's sha256 does not match the index")
path = os.path.join(tempfile.mkdtemp(), url.rsplit("/", 1)[1])
open(path, "wb").write(data)
# A pip wheel runs from the zip: install pip from its own wheel.
subprocess.check_call([sys.executable, os.path.join(path, "pip"), "install", "--quiet",
                       "--disable-pip-version-check", "--no-index", path])
PY
fi
echo "$VENV/bin"
