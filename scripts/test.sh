#!/usr/bin/env bash
# Install everything the tests need (a virtualenv with the package and its dev extras; a PostgreSQL
# server, Valgrind, and Chromium with its chromedriver from the system package manager), then run
# lint, type-check, every test and the counted instruction budget.
# The PostgreSQL cluster itself is a throwaway one started on 127.0.0.1 by tests/pgcluster.py.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {  # a system package the tests need, from the system package manager
  echo "scripts/test.sh: installing $1 from the system package manager" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$1" >/dev/null
}
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt_install postgresql
fi
# Valgrind counts the instructions of a transition for the budget check below.
if [ "${GRAPHFLOW_SKIP_BUDGET:-}" != "1" ] && ! command -v valgrind >/dev/null 2>&1; then
  apt_install valgrind
fi

# The console's tests drive the distribution's headless Chromium through its chromedriver.
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium
fi
if ! command -v chromedriver >/dev/null 2>&1; then
  apt_install chromium-driver
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
# The counted budget: instructions per transition on the event loop's thread (plain, NORMAL, FULL),
# deterministic where time is not; past benchmarks/budget.json by more than 3% fails. About 3 min.
# Skipped with GRAPHFLOW_SKIP_BUDGET=1.
if [ "${GRAPHFLOW_SKIP_BUDGET:-}" != "1" ]; then
  echo "== instruction budget" >&2
  .venv/bin/python benchmarks/instructions.py --check benchmarks/budget.json
fi
# The second, cheaper pass at the oldest autogen-agentchat pyproject declares (README, "Supported
# AutoGen versions"): AutoGen's GraphFlow tests both ways and our resume tests, in a scratch venv.
# Skipped with GRAPHFLOW_SKIP_FLOOR=1; nothing to do when the floor is the installed version.
if [ "${GRAPHFLOW_SKIP_FLOOR:-}" != "1" ]; then
  echo "== floor pass" >&2
  .venv/bin/python -m tests.upstream --floor
fi
