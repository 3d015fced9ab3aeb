#!/usr/bin/env bash
# Set up a virtual environment (CPU torch pinned: an unpinned torch pulls a multi-GB CUDA build) and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
log=$(mktemp)
if ! .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 triton==3.7.1 -e '.[dev]' >"$log" 2>&1; then
  grep -v "is ignored: it is neither" "$log" >&2; exit 1
fi
export TRITON_INTERPRET=1 GRADIO_ANALYTICS_ENABLED=False HF_HUB_DISABLE_TELEMETRY=1
exec .venv/bin/python -m pytest -q "$@"
