# SPDX-License-Identifier: MIT
"""xknn.mpi under mpirun (3 ranks): the script compares with single-process searches."""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py")
import xknn  # noqa: E402

try:
    from xknn import _xknn_mpi  # noqa: F401
except ImportError:
    _xknn_mpi = None


@pytest.mark.skipif(_xknn_mpi is None, reason="xknn built without MPI")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_mpi_three_ranks():
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    script = os.path.join(os.path.dirname(__file__), "mpi_script.py")
    run = subprocess.run(["mpirun", "-np", "3", sys.executable, script], env=env, capture_output=True,
                         text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    for r in range(3):
        assert f"xknn.mpi ok on rank {r} of 3" in out, out
    assert xknn.__version__
