"""Build of dlio-mpi: the Python package plus the C I/O core (csrc/*.c) behind the Cython
wrapper dlio_mpi._core.  Metadata lives in pyproject.toml."""

from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

core = Extension(
    "dlio_mpi._core",
    sources=["dlio_mpi/_core.pyx", *sorted(glob("csrc/*.c"))],
    include_dirs=["csrc"],
    depends=sorted(glob("csrc/*.h")),
    extra_compile_args=["-O2", "-pthread", "-std=gnu11", "-Wall"],
    extra_link_args=["-pthread"],
)

setup(
    # The shipped workloads live in the top-level configs/ and install as dlio_mpi.configs.
    # configs/workload/mlperf/: MLPerf Storage's files, shipped as mlperf/NAME
    packages=[*find_packages(include=["dlio_mpi", "dlio_mpi.*"]), "dlio_mpi.configs",
              "dlio_mpi.configs.workload", "dlio_mpi.configs.workload.mlperf"],
    package_dir={"dlio_mpi.configs": "configs"},
    package_data={"dlio_mpi.configs.workload": ["*.yaml"],
                  "dlio_mpi.configs.workload.mlperf": ["*.yaml", "README.md"]},
    ext_modules=cythonize([core], language_level=3),
)
