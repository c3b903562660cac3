#!/usr/bin/env bash
# Install everything the tests need (a virtualenv with the package and its dev extras, and a
# PostgreSQL server from the system package manager), then run lint, type-check and every test.
# The PostgreSQL cluster itself is a throwaway one started on 127.0.0.1 by tests/pgcluster.py.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "scripts/test.sh: installing PostgreSQL from the system package manager" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"

echo "== ruff" >&2
.venv/bin/ruff check src tests examples benchmarks
.venv/bin/ruff format --check src tests examples benchmarks
echo "== mypy --strict" >&2
.venv/bin/mypy
echo "== import contracts" >&2
.venv/bin/lint-imports
echo "== pytest" >&2
.venv/bin/python -m pytest "$@"
# The second, cheaper pass at the oldest autogen-agentchat pyproject declares (README, "Supported
# AutoGen versions"): AutoGen's GraphFlow tests both ways and our resume tests, in a scratch venv.
# Skipped with GRAPHFLOW_SKIP_FLOOR=1; nothing to do when the floor is the installed version.
if [ "${GRAPHFLOW_SKIP_FLOOR:-}" != "1" ]; then
  echo "== floor pass" >&2
  .venv/bin/python -m tests.upstream --floor
fi
