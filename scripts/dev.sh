#!/usr/bin/env bash
# Set-up and everyday commands. Creates .venv on first use (Python 3.10+ and pip are all it needs).
#   bash scripts/dev.sh quickstart [key=value ...]   run the quickstart (conf/quickstart.yaml)
#   bash scripts/dev.sh test [pytest args]            run the test suite (-m "not slow": the fast part)
#   bash scripts/dev.sh coverage [pytest args]        the suite under coverage.py: line coverage of fl/, every process
#   bash scripts/dev.sh lint                          ruff on fl/, tests/ and bench/
#   bash scripts/dev.sh bench [args]                  framework-overhead and memory benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
stamp="$VENV/.installed-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # constraints.txt: the exact versions the pinned test values and committed outputs were made with
  "$VENV/bin/python" -m pip install --quiet -e '.[dev]' -c constraints.txt
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
cmd=${1:-quickstart}
shift || true
case "$cmd" in
  quickstart) exec "$VENV/bin/python" -m fl.train "$@" ;;
  # one pytest worker per core, each with its share of the cores (tests/conftest.py), idle workers stealing queued
  # tests (the long multi-process tests do not queue behind each other); the slowest tests are listed at the end
  # compiled first: under PYTHONDONTWRITEBYTECODE (this machine sets it) each of the hundreds of processes the suite
  # starts would compile fl's sources again (0.5 s of CPU a process)
  test) "$VENV/bin/python" -m compileall -q fl tests bench
        exec "$VENV/bin/python" -m pytest -n auto --dist worksteal --durations=25 "$@" ;;
  # every process the suite starts writes its own data file (pyproject.toml, [tool.coverage.run]), combined at the end;
  # COVERAGE_FILE is absolute because the runs' processes start in their own folders
  coverage) "$VENV/bin/python" -m compileall -q fl tests bench
            export COVERAGE_FILE="$PWD/.coverage"
            rm -f .coverage .coverage.*
            status=0
            "$VENV/bin/python" -m coverage run -m pytest -n auto --dist worksteal "$@" || status=$?
            "$VENV/bin/python" -m coverage combine -q
            "$VENV/bin/python" -m coverage report --skip-covered --sort=miss | tail -25
            exit $status ;;
  lint) exec "$VENV/bin/ruff" check fl tests bench "$@" ;;
  bench) exec "$VENV/bin/python" bench/fedavg_overhead.py "$@" ;;
  *) echo "usage: bash scripts/dev.sh quickstart|test|coverage|lint|bench [args]" >&2; exit 2 ;;
esac
