"""python -m dlio_mpi: the same as the dlio-mpi command."""

import sys

from .cli import main

sys.exit(main())
