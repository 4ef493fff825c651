"""dlio-mpi calibrate: the real training pipeline measured once (command.py), the emulator's
model of its costs derived (model.py) and written into the workload (output.py); the
Datasets and DataLoader set-up it shares with the fidelity reference job (datasets.py), the
loader's instrumentation (measure.py) and a model's training step timed (model_step.py).
Imports torch: nothing of dlio-mpi's run imports this package."""
