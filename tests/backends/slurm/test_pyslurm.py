"""pyslurm: runs only where a pyslurm matching the cluster's Slurm imports."""

from __future__ import annotations

import pytest

from adapters.base import Unsupported
from adapters.slurm.pyslurm_transport import REASON, PyslurmTransport


def test_pyslurm_transport_says_why_it_is_unavailable():
    try:
        import pyslurm  # noqa: F401
    except ImportError:
        with pytest.raises(Unsupported) as exc:
            PyslurmTransport()
        assert exc.value.message == REASON
    else:  # pragma: no cover - no matching pyslurm/Slurm pair exists on this project's hosts
        pytest.skip("pyslurm imports here; see test_pyslurm_against_cluster")


@pytest.mark.slurm
def test_pyslurm_against_cluster():
    pytest.importorskip("pyslurm", reason=REASON)
    pytest.fail("pyslurm imports but the pyslurm transport is not implemented")  # pragma: no cover
