"""The real pools' fixtures, shared with tests/dispatch."""

from tests.dispatch.conftest import kube, slurm_cluster  # noqa: F401
