#!/usr/bin/env bash
# Python packages (and the npm CLIs) the `laguna serve` end-to-end tests (tests/serve) need on a fresh machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -m pip install --quiet --disable-pip-version-check -r "$here/tests/serve/requirements.txt"
# The coding-agent CLIs tests/serve/test_agent_clis.py drives (pinned; skipped there only without npm).
CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
if command -v npm >/dev/null; then
    have() { command -v "$1" >/dev/null && "$1" --version 2>/dev/null | grep -q "$2"; }
    if ! have claude "$CLAUDE_CODE_VERSION" || ! have codex "$CODEX_VERSION"; then
        npm install -g --no-fund --no-audit --loglevel=error \
            "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
    fi
fi
