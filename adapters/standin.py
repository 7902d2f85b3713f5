"""An IN-PROCESS STAND-IN for a pool: a fixed capacity snapshot and nothing else.

Not an adapter (it is not in adapters.base.ADAPTER_MODULES, nor registered, and cannot be
configured as a pool): tests and benchmarks that measure the gateway's own work in a
dispatch round (the pick, routing, the ledger, the writes) hand it to the Dispatcher
instead of a cluster and stub out submission. The same rounds run against the real
clusters in tests/dispatch/test_slurm_e2e.py, test_kube_e2e.py and tests/pools.
"""

from __future__ import annotations

from adapters.base import Backend, Capacity, PoolCapacity, Unsupported, features_of


class StandInPool(Backend):
    """``nodes`` nodes of ``gpus_per_node`` GPUs, ``idle`` of them idle (default: all), of one GPU type.

    ``kind`` (slurm | kubernetes) is the pool kind it stands in for: its name, and the kind's
    adapter's node exclusivity. Only :meth:`capacity` answers; it has no optional feature and
    there is nothing to submit to.
    """

    def __init__(self, kind: str, gpu_type: str | None = None, *, nodes: int = 64, idle: int | None = None,
                 gpus_per_node: int = 8, partition: str = "p"):
        self.name = kind  # type: ignore[misc]  # per stand-in, not per class
        self.node_exclusive = features_of(kind).node_exclusive  # type: ignore[misc]
        idle = nodes if idle is None else idle
        self.cap = Capacity(backend=kind, pools=(PoolCapacity(
            pool=partition, total_nodes=nodes, idle_nodes=idle, total_gpus=gpus_per_node * nodes,
            free_gpus=gpus_per_node * idle, gpus_per_node=gpus_per_node,
            gpu_types=(gpu_type,) if gpu_type else ()),))

    def capacity(self) -> Capacity:
        return self.cap

    def _nothing(self, *_args, **_kwargs):
        raise Unsupported("a stand-in pool runs nothing", backend=self.name)

    submit = status = cancel = find_by_gateway_id = _nothing  # type: ignore[assignment]
