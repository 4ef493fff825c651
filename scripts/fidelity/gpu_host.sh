#!/usr/bin/env bash
# The GPU host's side by side of docs/fidelity.md: torchvision's resnet50 trained on a real
# GPU (bf16) from a real DataLoader over 8,192 generated JPEGs, against dlio-mpi calibrated
# from that loader (and its step timed by calibrate --model), the usual configuration, and the
# same loader job with the step stood in by a sleep of its measured time.
#   scripts/fidelity/gpu_host.sh WORK_DIR [WORKERS (default 12,4)]
# Needs torch with CUDA and torchvision, dlio-mpi importable (installed, or built in place
# and on PYTHONPATH) and mpiexec.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:?usage: scripts/fidelity/gpu_host.sh WORK_DIR [WORKERS]}
workers=${2:-12,4}
python3 scripts/fidelity/compare.py scripts/fidelity/workloads/jpeg_gpu.yaml --work "$work" \
    --workers "$workers" --ranks 1 --epochs 2 --files 4096 \
    --model torchvision.models:resnet50 --device cuda --stand-in --baseline
