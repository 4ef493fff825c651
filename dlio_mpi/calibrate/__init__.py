"""dlio-mpi calibrate: the real training pipeline measured once and the emulator's model of its
costs written into the workload; the Datasets the fidelity reference job shares.

The pipeline is measured by command.py with the loader's instrumentation (measure.py) and a
model's training step timed (model_step.py); the model is derived (model.py) and written into
the workload (output.py); the Datasets and DataLoader set-up are datasets.py's. Imports
torch: nothing of dlio-mpi's run imports this package."""
