#!/usr/bin/env bash
# A real emulation on 2 MPI ranks: installs dlio-mpi into ./.venv, generates the small
# unet3d-like "demo" dataset under ./data/demo, trains 2 epochs and prints the results table
# (files in ./output/demo). Extra arguments are passed on as overrides, e.g.
#   scripts/demo.sh reader.odirect=true train.epochs=3
set -euo pipefail
source "$(dirname "$0")/_env.sh"
cd "$ROOT"
mpiexec -n 2 dlio-mpi run demo "$@"
