"""reader.sampling: replacement under mpiexec -n 2 and -n 3: each rank draws its training
samples uniformly with replacement (repeats happen, every id in range), the same draws for the
same seed, other draws each epoch; read_once delivers exactly the samples drawn (duplicates
too), the bytes checked against the files."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import mpiexec, run_cli, workload_overrides

pytestmark = pytest.mark.timeout(300)


def _args(tmp, out: str, **values) -> list[str]:
    base = dict(dataset__format="indexed_binary", dataset__num_files_train=8,
                dataset__num_samples_per_file=8, dataset__record_length_bytes=4096,
                reader__batch_size=4, train__epochs=2, reader__sampling="replacement",
                output__folder=tmp / out, output__access_log="true")
    base.update(values)
    return workload_overrides(tmp, **base)


def _logs(out, ranks: int) -> dict:
    return {(e, r): np.load(out / "access_log" / f"epoch{e}_rank{r}.npy")
            for e in (1, 2) for r in range(ranks)}


@pytest.mark.parametrize("ranks", [2, 3])
def test_draws_with_replacement_are_seeded_and_served_by_read_once(tmp_path, ranks):
    for out in ("a", "b"):
        res = run_cli(["run", "demo", *_args(tmp_path, out)], ranks=ranks)
        assert res.returncode == 0, res.stderr
    a, b = _logs(tmp_path / "a", ranks), _logs(tmp_path / "b", ranks)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])  # the same seed, the same draws
        assert a[key].min() >= 0 and a[key].max() < 64
    drawn = np.concatenate([a[(1, r)] for r in range(ranks)])
    assert len(np.unique(drawn)) < len(drawn)  # some sample came twice
    assert not np.array_equal(a[(1, 0)], a[(2, 0)])  # seed_change_epoch: other draws
    env = {**os.environ, "DLIO_MPI_TEST_VERIFY_EXCHANGE": "1"}
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-P", "-m", "dlio_mpi", "run", "demo",
           *_args(tmp_path, "c", reader__staging="read_once")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stderr
    c = _logs(tmp_path / "c", ranks)
    for key in a:
        np.testing.assert_array_equal(c[key], a[key])
