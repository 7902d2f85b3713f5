"""The backend contract suite against the local Kubernetes + Kueue control plane."""

import pytest

from tests.contract.suite import BackendContract

pytestmark = pytest.mark.kubernetes


@pytest.mark.usefixtures("clean")
class TestKubernetesContract(BackendContract):
    final_timeout_s = 60.0
