"""The backend contract suite against the local Kubernetes + Kueue control plane, on both of
its pools (ClusterQueues ``isthmus-gpu`` over the a100 nodes and ``isthmus-h100``)."""

import pytest

from tests.contract.suite import BackendContract

pytestmark = pytest.mark.kubernetes


@pytest.mark.usefixtures("clean")
class TestKubernetesContract(BackendContract):
    final_timeout_s = 60.0


@pytest.mark.usefixtures("clean")
class TestKubernetesH100Contract(BackendContract):
    """The same contract on the second pool of the one control plane (issue #13: the
    contract suite on every pool of the five-pool test gateway)."""

    final_timeout_s = 60.0

    @pytest.fixture
    def backend(self, h100):
        return h100
