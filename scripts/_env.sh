# Sourced by the scripts: make ./.venv (once), install dlio-mpi into it from this checkout
# (building the C core), and put it first on PATH. Usage: source scripts/_env.sh [test]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PYTHON" -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
fi
extra=""
[ "${1:-}" = "test" ] && extra="[test,torch,tensorflow]"
"$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check "$ROOT$extra"
export PATH="$ROOT/.venv/bin:$PATH"
