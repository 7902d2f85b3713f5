"""Routing: which pool a gang goes to, and why, in words a user can read.

Pools are data (gateway/pools): any number, each of a kind whose adapter says whether it is
node-exclusive (Slurm) or packs GPUs (Kubernetes), with a state, a routing weight and a
cost. A pool is a candidate when it is ``active`` (draining and disabled pools get nothing
new), of the job's ``pool_kind`` if it asks for one, the job can EVER fit it (static limits: GPUs per
node, node count, total GPUs, container support, GPU type) and the account's per-pool
quota allows it. Among candidates, the job goes to a pool where the WHOLE gang fits now
(Slurm: enough idle nodes for exclusive allocation; Kubernetes: enough free GPUs in the
ClusterQueue); ties are broken by the pool's weight, its cost (cheaper first, scaled by
``routing_cost_factor``), the free share left after placement, and the pool's queue depth. If no pool has room now the job stays pending in
the gateway, where fair share orders it, rather than queueing in a backend's own FIFO.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping

from adapters.base import Capacity, Feature, Features, features_of
from gateway.domain.planner import take_domains
from gateway.domain.shapes import normalise_gpu_type, parse_memory_mib
from gateway.domain.storage import needed_storages, remounts


@dataclasses.dataclass
class PoolView:
    """One backend's capacity as seen at the start of a dispatch round."""

    name: str
    capacity: Capacity | None
    error: str = ""
    free_gpus: int = 0
    idle_nodes: int = 0
    total_gpus: int = 0
    total_nodes: int = 0
    gpus_per_node: int = 0
    gpu_types: frozenset[str] = frozenset()
    queue_depth: int = 0
    memory_mib_per_node: int = 0  # 0: unknown
    cpus_per_node: int = 0
    kind: str = ""  # slurm | kubernetes; "" = the backend's own name (its kind)
    state: str = "active"  # active | draining | disabled (the pool table)
    weight: float = 1.0  # routing weight (> 0)
    cost: float = 1.0  # billing weight per GPU-second, the cost term of routing
    # Why the pool cannot run a container image ("" when it can): from its adapter.
    image_unsupported: str = ""
    # The storages the pool provides (the pools file's storage section, docs/storage.md),
    # and why it cannot show one at a path of the job's choosing ("" when it can).
    storages: frozenset[str] = frozenset()
    remount_unsupported: str = ""
    # The pool's network domains (docs/planning.md, "Topology"): level -> {domain: idle nodes},
    # moved by take() within a round; and level -> the largest domain's nodes (a static limit).
    domains: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    topology_sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    # On a pool that places GPUs one by one: level -> {domain: GPUs free on each of its nodes},
    # moved by take() too; a domain's room for a gang is whole workers per node (room()).
    domain_gpus: dict[str, dict[str, list[int]]] = dataclasses.field(default_factory=dict)
    # (shape, name) -> _excluded()'s note: it reads only what a round never changes (take()
    # moves free GPUs, idle nodes and the queue), so a round asks it once per job shape and
    # pool, not once per job and pool. Not copied by dataclasses.replace (a fresh view).
    _excluded_memo: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)
    _described: tuple = dataclasses.field(default=(None, ""), init=False, repr=False, compare=False)
    _exclusive: tuple = dataclasses.field(default=(None, False), init=False, repr=False, compare=False)
    # What the pool's adapter can do (adapters.base.features_of of the built backend: its
    # settings and transport count); None: only what its kind's adapter class says.
    features: Features | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.kind:
            self.kind = self.features.backend if self.features is not None else self.name
        if self.features is not None:
            features = self.features
            self.image_unsupported = self.image_unsupported or features.why_not(Feature.CONTAINER_IMAGE)
            self.remount_unsupported = self.remount_unsupported or features.why_not(Feature.MOUNT_PATHS)

    # The facts never_fits() reads, which do not move from round to round: what a process
    # without a dispatcher judges a submission by (gateway/pools/service.py stored_views).
    LIMIT_FIELDS = ("total_gpus", "total_nodes", "gpus_per_node", "memory_mib_per_node", "cpus_per_node",
                    "image_unsupported", "remount_unsupported", "topology_sizes")

    def limits(self) -> dict | None:
        """The pool's static limits (None without a capacity snapshot: nothing is known)."""
        if self.capacity is None:
            return None
        out = {f: getattr(self, f) for f in self.LIMIT_FIELDS}
        out["gpu_types"] = sorted(self.gpu_types)
        return out

    @classmethod
    def from_limits(cls, name: str, limits: Mapping, meta: Mapping | None = None) -> PoolView:
        """A view that knows only the pool's static limits (free capacity unknown, taken as
        none): enough for :func:`never_fits` and :func:`check_pinned`, never for routing."""
        meta = {k: v for k, v in dict(meta or {}).items() if k != "gpu_types"}
        known = {f: limits[f] for f in cls.LIMIT_FIELDS if f in limits}
        if "topology_sizes" in known:
            known["topology_sizes"] = dict(known["topology_sizes"] or {})
        return cls(name=name, capacity=Capacity(backend=meta.get("kind", name), pools=()),
                   gpu_types=frozenset(limits.get("gpu_types") or ()), **known, **meta)

    @classmethod
    def of_capacity(cls, name: str, features: Features | None, cap: Capacity | None, *, error: str = "",
                    queue_depth: int = 0, meta: Mapping | None = None) -> PoolView:
        """The view of what a pool's adapter answered (``cap``), or of why it could not
        (``error``, with ``cap`` None). Pure: asking the adapter is the caller's
        (``gateway/pools/service.py::snapshot``; issue #46). ``meta``: the pool's row (kind,
        state, weight, cost, gpu_types); configured GPU types replace the ones it reports."""
        meta = dict(meta or {})
        configured_types = frozenset(normalise_gpu_type(t) for t in meta.pop("gpu_types", None) or ())
        if cap is None:
            return cls(name=name, features=features, capacity=None, error=error, queue_depth=queue_depth,
                       gpu_types=configured_types, **meta)
        return cls(
            name=name, features=features, capacity=cap, **meta,
            free_gpus=sum(p.free_gpus for p in cap.pools), idle_nodes=sum(p.idle_nodes for p in cap.pools),
            total_gpus=sum(p.total_gpus for p in cap.pools), total_nodes=sum(p.total_nodes for p in cap.pools),
            gpus_per_node=max((p.gpus_per_node for p in cap.pools), default=0),
            gpu_types=configured_types or frozenset(normalise_gpu_type(t) for p in cap.pools for t in p.gpu_types),
            queue_depth=queue_depth,
            memory_mib_per_node=max((p.memory_mib_per_node for p in cap.pools), default=0),
            cpus_per_node=max((p.cpus_per_node for p in cap.pools), default=0),
            **topology_of(d for p in cap.pools for d in p.topology),
        )

    def for_round(self) -> PoolView:
        """A copy a round may move (take()), with domain counts and memos of its own.

        A shallow copy, not ``dataclasses.replace``: replace runs ``__post_init__``, which asks
        the backend for its features again (runtime Protocol checks, a tenth of a millisecond a
        pool), and the copy's come from the same backend as this view's (issue #46: 100 pools).
        """
        view = copy.copy(self)
        view.domains = {level: dict(d) for level, d in self.domains.items()}
        view.domain_gpus = {level: {name: list(f) for name, f in d.items()} for level, d in self.domain_gpus.items()}
        view._excluded_memo, view._described, view._exclusive = {}, (None, ""), (None, False)
        return view

    @property
    def node_exclusive(self) -> bool:
        """Whether a worker takes whole nodes: routing, the planner and the ledger then count the
        pool in nodes. As the adapter of the pool's kind says (never the pool's name), so that a
        view built from a stored row (another process, no backend) counts as the dispatcher's."""
        kind, exclusive = self._exclusive  # asked many times per job a round routes
        if kind != self.kind:
            exclusive = features_of(self.kind).node_exclusive
            self._exclusive = (self.kind, exclusive)
        return exclusive

    def describe(self) -> str:
        # Asked for every pool of every job a round routes; it changes only when take() does.
        key = (self.free_gpus, self.idle_nodes)
        if self._described[0] != key:
            self._described = (key, self._describe())
        return self._described[1]

    def _describe(self) -> str:
        if self.capacity is None:
            return f"{self.name}: unavailable ({self.error})"
        details = "; ".join(p.detail for p in self.capacity.pools if p.detail)
        if details:
            return f"{self.name}: {details}"
        if self.node_exclusive:
            return (f"{self.name}: {self.idle_nodes} of {self.total_nodes} nodes idle "
                    f"({self.free_gpus} of {self.total_gpus} GPUs free)")
        return f"{self.name}: {self.free_gpus} of {self.total_gpus} GPUs free"


def topology_of(domains) -> dict:
    """PoolView's ``domains`` and ``topology_sizes`` from the backend's TopologyDomains."""
    idle: dict[str, dict[str, int]] = {}
    sizes: dict[str, int] = {}
    gpus: dict[str, dict[str, list[int]]] = {}
    for d in domains:
        idle.setdefault(d.level, {})[d.name] = d.idle_nodes
        sizes[d.level] = max(sizes.get(d.level, 0), len(d.nodes))
        if d.free_gpus:
            gpus.setdefault(d.level, {})[d.name] = list(d.free_gpus)
    return {"domains": idle, "topology_sizes": sizes, "domain_gpus": gpus}


def topology_words(domains: Iterable[tuple[str, str, int, int]]) -> str:
    """A pool's domains as the CLI and the dashboard show them, from (level, name, idle nodes,
    nodes): "rack: r1 1/2 idle, r2 2/2 idle" ("" for a pool without domains)."""
    by_level: dict[str, list[str]] = {}
    for level, name, idle, total in domains:
        by_level.setdefault(level, []).append(f"{name} {idle}/{total} idle")
    return "; ".join(f"{level}: {', '.join(items)}" for level, items in by_level.items())


def room(shape: JobShape, view: PoolView, level: str) -> dict[str, int]:
    """How many of the gang's workers each domain of ``level`` holds now: its idle nodes on a
    node-exclusive pool (a worker takes a whole node), else the whole workers its nodes' free
    GPUs make, node by node (a worker's GPUs are on one node)."""
    per_node = view.domain_gpus.get(level) if not view.node_exclusive else None
    if not per_node:
        return dict(view.domains.get(level, {}))
    g = shape.gpus_per_worker
    return {name: sum(f // g for f in free) if g > 0 else shape.workers for name, free in per_node.items()}


@dataclasses.dataclass(frozen=True)
class JobShape:
    workers: int
    gpus_per_worker: int
    total_gpus: int
    image: str | None
    gpu_type: str | None
    memory_mib_per_worker: int = 0
    cpus_per_worker: int = 0
    pool_kind: str | None = None  # only pools of this kind
    storages: frozenset[str] = frozenset()  # only pools that provide all of these (mounts, checkpoint)
    remounts: bool = False  # a mount at a path of the job's choosing
    topology: str = ""  # a network domain level the whole gang should sit in ("": any packing)
    topology_required: bool = False  # True: it waits for one such domain; False: preferred

    def __hash__(self) -> int:
        # Kept once computed: a round looks a shape up once per pool (PoolView._excluded_memo).
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = self.__dict__["_hash"] = hash((self.workers, self.gpus_per_worker, self.total_gpus, self.image,
                                               self.gpu_type, self.memory_mib_per_worker, self.cpus_per_worker,
                                               self.pool_kind, self.storages, self.remounts, self.topology,
                                               self.topology_required))
            return h

    @classmethod
    def of_spec(cls, *, workers: int, gpus_per_worker: int, total_gpus: int, spec: dict) -> JobShape:
        memory = spec.get("memory_per_worker")
        return cls(workers=workers, gpus_per_worker=gpus_per_worker, total_gpus=total_gpus,
                   image=spec.get("image"), gpu_type=spec.get("gpu_type"),
                   memory_mib_per_worker=parse_memory_mib(memory) if memory else 0,
                   cpus_per_worker=int(spec.get("cpus_per_worker") or 0), pool_kind=spec.get("pool_kind"),
                   storages=needed_storages(spec), remounts=remounts(spec),
                   topology=(topo.get("required") or topo.get("preferred") or "") if (topo := spec.get("topology")) else "",
                   topology_required=bool(topo and topo.get("required")))


def never_fits(shape: JobShape, view: PoolView) -> str | None:
    """Why this job can never run on this pool, or None. Needs a capacity snapshot."""
    if shape.image and view.image_unsupported:
        return view.image_unsupported
    missing = shape.storages - view.storages
    if missing:
        return ", ".join(f"no storage {m!r}" for m in sorted(missing))
    if shape.remounts and view.remount_unsupported:
        return view.remount_unsupported
    if view.capacity is None:
        return None  # unknown now; not a reason to refuse forever
    if shape.gpu_type and normalise_gpu_type(shape.gpu_type) not in view.gpu_types:
        # A pool whose GPUs have no type (none configured, none reported) cannot honour a
        # typed request: Slurm refuses gpu:<type> on untyped GRES, no Kubernetes node has the label.
        has = ", ".join(sorted(view.gpu_types)) or "none of a known type"
        return f"no {shape.gpu_type} GPUs (has {has})"
    if view.gpus_per_node and shape.gpus_per_worker > view.gpus_per_node:
        return f"a worker asks {shape.gpus_per_worker} GPUs; nodes have {view.gpus_per_node}"
    if view.memory_mib_per_node and shape.memory_mib_per_worker > view.memory_mib_per_node:
        return (f"a worker asks {shape.memory_mib_per_worker} MiB of memory; the largest node has "
                f"{view.memory_mib_per_node} MiB")
    if view.cpus_per_node and shape.cpus_per_worker > view.cpus_per_node:
        return f"a worker asks {shape.cpus_per_worker} CPUs; the largest node has {view.cpus_per_node}"
    if view.node_exclusive and shape.workers > view.total_nodes:
        return f"{shape.workers} workers need {shape.workers} whole nodes; the pool has {view.total_nodes}"
    if shape.total_gpus > view.total_gpus:
        return f"the gang needs {shape.total_gpus} GPUs; the pool has {view.total_gpus}"
    if shape.topology_required:
        size = view.topology_sizes.get(shape.topology)
        if size is None:
            has = ", ".join(sorted(view.topology_sizes)) or "none"
            return f"no network domains of level {shape.topology!r} (levels: {has})"
        if view.node_exclusive and shape.workers > size:
            return f"{shape.workers} workers need one {shape.topology} of {shape.workers} nodes; the largest has {size}"
        per_node = view.gpus_per_node // shape.gpus_per_worker if shape.gpus_per_worker and view.gpus_per_node else 0
        if not view.node_exclusive and per_node and shape.workers > size * per_node:
            return (f"{shape.workers} workers of {shape.gpus_per_worker} GPUs need one {shape.topology}; the largest "
                    f"has {size} nodes of {view.gpus_per_node} GPUs")
    return None


def domains_needed(shape: JobShape, view: PoolView) -> int:
    """How few domains of the pool's finest level the gang would take now (1: it fits in one;
    0: the pool declares no domains). Routing prefers the pool where this is smallest."""
    if not view.domains:
        return 0
    finest = min(view.domains, key=lambda level: view.topology_sizes.get(level, 0))
    left, used = shape.workers, 0
    for idle in sorted(room(shape, view, finest).values(), reverse=True):
        if left <= 0:
            break
        left -= idle
        used += 1
    return used


def domain_wait(shape: JobShape, view: PoolView) -> str:
    """Why a gang that requires one domain cannot start on the pool now although it may have
    idle nodes enough ("" when a domain has room, or the gang has no such rule)."""
    if not shape.topology_required or view.capacity is None or shape.topology not in view.domains:
        return ""
    if _domain_for(shape, view) is not None:
        return ""
    each = ", ".join(f"{name} {n}" for name, n in sorted(room(shape, view, shape.topology).items()))
    if view.node_exclusive:
        return f"no {shape.topology} of {view.name} has {shape.workers} idle nodes (idle: {each})"
    return (f"no {shape.topology} of {view.name} has room for {shape.workers} workers of {shape.gpus_per_worker} "
            f"GPUs (room: {each})")


def _domain_for(shape: JobShape, view: PoolView, level: str = "") -> tuple[str, str] | None:
    """The domain of ``level`` (default: the one the gang requires) it would take now (the
    fullest one that fits: best fit, as Slurm's topology plugins choose), or None."""
    level = level or shape.topology
    fits = [(n, name) for name, n in room(shape, view, level).items() if n >= shape.workers]
    return (level, min(fits)[1]) if fits else None


def held_gpus(shape: JobShape, view: PoolView) -> int:
    """GPUs the gang will hold on this pool, which is what the ledger reserves, limits and charges.

    A node-exclusive pool gives each worker a whole node and every GPU on it (sbatch(1)
    ``--exclusive``: "the job is allocated all CPUs and GRES on all nodes"), whatever the job
    asked for: workers x the pool's GPUs per node (its largest node when nodes differ). Other
    pools place GPUs one by one: what was asked.
    """
    if view.node_exclusive and view.gpus_per_node:
        return max(shape.total_gpus, shape.workers * view.gpus_per_node)
    return shape.total_gpus


def fits_now(shape: JobShape, view: PoolView) -> bool:
    if view.capacity is None:
        return False
    if view.node_exclusive:
        if shape.topology_required and _domain_for(shape, view) is None:
            return False
        return view.idle_nodes >= shape.workers
    if shape.topology_required and shape.topology in view.domains and _domain_for(shape, view) is None:
        return False
    return view.free_gpus >= shape.total_gpus


def take(shape: JobShape, view: PoolView) -> None:
    """Account for a placement within the round, so one snapshot is not handed out twice."""
    view.free_gpus = max(0, view.free_gpus - shape.total_gpus)
    if view.node_exclusive:
        take_domains(view.domains, shape.workers, shape.topology if shape.topology_required else "")
        view.idle_nodes = max(0, view.idle_nodes - shape.workers)
        view.free_gpus = min(view.free_gpus, view.idle_nodes * view.gpus_per_node) if view.gpus_per_node else view.free_gpus
    elif view.domain_gpus and shape.gpus_per_worker:
        _take_gpus(shape, view)
    view.queue_depth += 1


def _take_gpus(shape: JobShape, view: PoolView) -> None:
    """take() on a pool that places GPUs one by one: at each level, the gang's workers leave
    the fullest domain that holds them all (best fit, as Kueue's TAS chooses), node by node,
    fullest node first; a gang no domain holds leaves the counts as they are (the next
    snapshot has them)."""
    g = shape.gpus_per_worker
    for level, per_node in view.domain_gpus.items():
        chosen = _domain_for(shape, view, level)
        if chosen is None:
            continue
        name = chosen[1]
        free, left = per_node[name], shape.workers
        for i in sorted(range(len(free)), key=lambda i: -free[i]):
            take_n = min(left, free[i] // g)
            if take_n and view.domains.get(level, {}).get(name, 0) and free[i] == view.gpus_per_node:
                view.domains[level][name] -= 1  # an idle node is idle no longer
            free[i] -= take_n * g
            left -= take_n
            if left <= 0:
                break


@dataclasses.dataclass(frozen=True)
class Decision:
    pool: str | None  # None: stays pending
    reason: str  # shown on the job
    rejected: bool = False  # True: can never run where it was pinned -> reject


def parse_weights(raw: str) -> dict[str, float]:
    try:
        value = json.loads(raw or "{}")
        return {str(k): float(v) for k, v in value.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def _excluded(shape: JobShape, name: str, view: PoolView) -> str | None:
    """The note saying why this pool may not take the job at all (kind, fit, state), or None."""
    key = (shape, name)
    try:
        return view._excluded_memo[key]
    except KeyError:
        note = view._excluded_memo[key] = _excluded_now(shape, name, view)
        return note


def _excluded_now(shape: JobShape, name: str, view: PoolView) -> str | None:
    if shape.pool_kind and view.kind != shape.pool_kind:
        return f"{name}: cannot run this job (a {view.kind} pool; the job asks for {shape.pool_kind})"
    why_never = never_fits(shape, view)
    if why_never:
        return f"{name}: cannot run this job ({why_never})"
    if view.state != "active":
        return f"{name}: {view.state} (takes no new jobs)"
    return None


def _score(shape: JobShape, name: str, view: PoolView, weights: Mapping[str, float]) -> float:
    """A pool's score before the cost term: weight, plus the share left free, minus its queue,
    minus a little for each network domain beyond one the gang would span there."""
    left = (view.free_gpus - shape.total_gpus) / view.total_gpus if view.total_gpus else 0.0
    spans = max(0, domains_needed(shape, view) - 1)
    return view.weight * weights.get(name, 1.0) + left - 0.05 * view.queue_depth - 0.1 * spans


def _by_score(scored: list[tuple[float, float, str]], cost_factor: float) -> list[str]:
    """(score before cost, cost, name) -> names, best first: the cost term, then ties by name."""
    if not scored:
        return []
    cheapest = min(cost for _, cost, _ in scored)
    return [name for _, name in sorted(((score - cost_factor * (cost / cheapest - 1.0), name)
                                         for score, cost, name in scored), key=lambda t: (-t[0], t[1]))]


def ranked(shape: JobShape, requested: str, views: Mapping[str, PoolView], *,
           weights: Mapping[str, float] | None = None, cost_factor: float = 1.0) -> list[str]:
    """The pools this job may use, now or later, best first by :func:`route`'s score.

    The same rules as ``route`` (kind asked for, can ever fit, ``active``), for the
    reservation planner, which picks the pool where the job starts earliest and breaks ties
    by this order (so cost and weight count there too).
    """
    weights = weights or {}
    names = [requested] if requested != "auto" else sorted(views)
    usable = [(_score(shape, n, views[n], weights), views[n].cost, n) for n in names
              if n in views and _excluded(shape, n, views[n]) is None]
    return _by_score(usable, cost_factor)


def route(shape: JobShape, requested: str, views: Mapping[str, PoolView], *,
          quota_refusals: Mapping[str, str] | None = None, weights: Mapping[str, float] | None = None,
          queue_depth: int = 0, cost_factor: float = 1.0, only: str | None = None) -> Decision:
    """Pick a pool for one job now (see module docstring).

    ``weights`` (the old ``ISTHMUS_ROUTING_WEIGHTS``) multiply each pool's own weight.
    ``only``: the pool the reservation planner chose; the others are still described in the
    reason (why not there) but not picked.
    """
    quota_refusals = quota_refusals or {}
    weights = weights or {}
    names = [requested] if requested != "auto" else sorted(views)
    if requested != "auto" and requested not in views:
        return Decision(None, f"pool {requested!r} is not configured on this gateway", rejected=True)
    notes: list[str] = []
    fitting: list[tuple[float, float, str]] = []  # (score before cost, cost, name)
    for name in names:
        view = views[name]
        excluded = _excluded(shape, name, view)
        if excluded:
            notes.append(excluded)
            continue
        if name in quota_refusals:
            notes.append(f"{name}: quota ({quota_refusals[name]})")
            continue
        notes.append(view.describe())
        if wait := domain_wait(shape, view):
            notes.append(wait)
        if only is not None and name != only:
            continue
        # A gang that must wait for one domain waits here, not in the backend's queue.
        if fits_now(shape, view) or (view.capacity is not None and view.queue_depth < queue_depth and not wait):
            fitting.append((_score(shape, name, view, weights), view.cost, name))
    if fitting:
        chosen = _by_score(fitting, cost_factor)[0]
        return Decision(chosen, f"routed to {chosen}; " + "; ".join(notes))
    every_never = all(n.split(":", 1)[1].strip().startswith("cannot run") for n in notes) and notes
    if every_never:
        return Decision(None, "; ".join(notes), rejected=True)
    return Decision(None, "waiting for capacity: " + "; ".join(notes))


def check_pinned(shape: JobShape, requested: str, views: Mapping[str, PoolView]) -> str | None:
    """At submit time: the reason a job can never run where it asks to, or None."""
    def why(view: PoolView) -> str | None:
        if shape.pool_kind and view.kind != shape.pool_kind:
            return f"a {view.kind} pool; the job asks for {shape.pool_kind}"
        return never_fits(shape, view)

    if requested == "auto":
        if views and all(why(v) for v in views.values()):
            return "; ".join(f"{n}: {why(v)}" for n, v in sorted(views.items()))
        return None
    if requested not in views:
        return f"pool {requested!r} is not configured on this gateway (GET /v1/pools lists them)"
    reason = why(views[requested])
    return f"{requested}: {reason}" if reason else None
