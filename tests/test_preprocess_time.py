"""reader.preprocess_time: each sample's preprocessing, slept by the native engine's reader
thread after the sample's read, before its batch is ready, overlapping the compute of the steps
before (as a loader's workers preprocess). With one reader thread, batches of 4 samples of
5 ms each need 20 ms, against 10 ms of compute: the steps wait about 10 ms each for storage
(the stall the metrics report) and AU falls to about half, with the native engine, the
MPI-IO readers and the torch DataLoader (reader.engine framework); with a preprocessing
shorter than the compute it is hidden. Run in-process under mpiexec -n 2 and -n 3."""

from __future__ import annotations

import pytest

from helpers import workload_overrides

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]


def _run(tmp, preprocess: float, engine: str = "native", access: str = "multi") -> dict:
    from mpi4py import MPI

    from dlio_mpi.config import load_config
    from dlio_mpi.run import run

    return run(MPI.COMM_WORLD, load_config("demo", workload_overrides(
        tmp / f"p{preprocess}{engine}{access}", dataset__format="npy", dataset__num_files_train=24,
        dataset__num_samples_per_file=1, reader__batch_size=4, reader__read_threads=1,
        reader__prefetch_size=2, train__computation_time=0.01, train__epochs=1,
        reader__preprocess_time=preprocess, workflow__generate_data="true",
        reader__engine=engine, framework="pytorch", reader__data_loader="pytorch",
        reader__file_access=access)))


# framework: the torch DataLoader's worker sleeps it after each item's np.load; MPI-IO: the
# thread that read the batch (the prefetch thread; collective: the step loop's) after it
@pytest.mark.parametrize("engine,access", [("native", "multi"), ("framework", "multi"),
                                           ("native", "shared"), ("native", "collective")])
def test_preprocessing_longer_than_compute_stalls_the_steps(shared_tmp, engine, access):
    from mpi4py import MPI

    slow = _run(shared_tmp, 0.005, engine, access)["metric"]
    steps = 24 // MPI.COMM_WORLD.Get_size() // 4
    stall = slow["train_storage_stall_seconds_per_rank"]["min"]
    # 20 ms of preprocessing per batch, 10 ms of compute: ~10 ms of stall per step after the
    # first, 20 ms in the first (lower bounds: a loaded machine only adds)
    assert stall >= 0.020 + 0.5 * 0.010 * (steps - 1)
    assert slow["train_au_mean_percentage"] < 80


def test_preprocessing_shorter_than_compute_is_hidden(shared_tmp):
    quick = _run(shared_tmp, 0.0005)["metric"]  # 2 ms a batch under 10 ms of compute
    assert quick["train_au_mean_percentage"] > 70
