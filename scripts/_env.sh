# Sourced by the scripts, and by you: `source scripts/_env.sh [test]` makes ./.venv (once),
# installs dlio-mpi into it from this checkout (building the C core) when the checkout changed
# since the last install, and puts the venv first on PATH. With `test`, the test tools and the
# torch and tensorflow extras too (torch's CPU build). Your shell's options are left as they
# were; a failed step returns 1.
_dlio_mpi_env() (
  set -euo pipefail
  local root="$1" extra="${2:-}"
  local python="${PYTHON:-python3}" venv="$root/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
      echo "dlio-mpi needs Python >= 3.10 (found $("$python" --version 2>&1)); set PYTHON=" >&2
      return 1
    }
    "$python" -m venv "$venv" || {
      echo "cannot make $venv: on Debian or Ubuntu, apt-get install python3-venv" >&2
      return 1
    }
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  if [ "$extra" = "test" ] && ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    # torch's PyPI wheel for Linux is the CUDA build (2.7 GB of NVIDIA packages): take the CPU
    # build from PyTorch's index, torch alone (its dependencies come from PyPI below)
    "${pip[@]}" --no-deps "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu ||
      echo "_env.sh: torch's CPU build could not be had from download.pytorch.org; the" \
           "torch extra takes PyPI's torch (on Linux x86_64 the CUDA build, 2.7 GB)" >&2
  fi
  # reinstall only when a source file of the package is newer than the last install (an
  # install with the test extras serves a plain one too)
  local stamp="$venv/.dlio_mpi_installed${extra:+_$extra}" done
  for done in "$stamp" "$venv/.dlio_mpi_installed_test"; do
    if [ -e "$done" ] && [ -z "$(cd "$root" && find dlio_mpi csrc setup.py pyproject.toml \
          -name __pycache__ -prune -o -type f -newer "$done" ! -name _core.c ! -name '*.so' \
          -print 2>/dev/null | head -n 1)" ]; then
      return 0
    fi
  done
  local spec="$root"
  [ "$extra" = "test" ] && spec="$root[test,torch,tensorflow]"
  touch "$stamp.new"
  "${pip[@]}" "$spec"
  mv "$stamp.new" "$stamp"
)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if _dlio_mpi_env "$ROOT" "${1:-}"; then
  export PATH="$ROOT/.venv/bin:$PATH"
  unset -f _dlio_mpi_env
else
  unset -f _dlio_mpi_env
  return 1 2>/dev/null || exit 1
fi
