"""An IN-PROCESS STAND-IN for a pool: a fixed capacity snapshot and nothing else.

Not an adapter (it is not in gateway/pools/adapters.py's ADAPTER_MODULES and cannot be
configured as a pool): tests and benchmarks that measure the gateway's own work in a
dispatch round (the pick, routing, the ledger, the writes) hand it to the Dispatcher
instead of a cluster and stub out submission. The same rounds run against the real
clusters in tests/dispatch/test_slurm_e2e.py, test_kube_e2e.py and tests/pools.
"""

from __future__ import annotations

from typing import ClassVar

from adapters.base import Capacity, Feature, PoolCapacity


class StandInPool:
    """``nodes`` nodes of ``gpus_per_node`` GPUs, ``idle`` of them idle (default: all), of one GPU type.

    ``kind`` (slurm | kubernetes) is what routing reads from a backend's name. Only
    :meth:`capacity` answers; there is nothing to submit to.
    """

    unsupported_features: ClassVar[dict[str, str]] = {}

    def __init__(self, kind: str, gpu_type: str | None = None, *, nodes: int = 64, idle: int | None = None,
                 gpus_per_node: int = 8, partition: str = "p"):
        self.name = kind
        idle = nodes if idle is None else idle
        self.cap = Capacity(backend=kind, pools=(PoolCapacity(
            pool=partition, total_nodes=nodes, idle_nodes=idle, total_gpus=gpus_per_node * nodes,
            free_gpus=gpus_per_node * idle, gpus_per_node=gpus_per_node,
            gpu_types=(gpu_type,) if gpu_type else ()),))

    def capacity(self) -> Capacity:
        return self.cap

    def supports(self, feature: Feature) -> bool:
        return False

    def close(self) -> None:
        pass
