"""Pools on the wire."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gateway.kit.names import ACCOUNT_NAME_RE, GPU_TYPE_RE, NODE_NAME_RE, POOL_NAME_RE


class PoolState(str, enum.Enum):
    """`active` takes new jobs; `draining` takes none and lets running ones finish; `disabled` takes none."""

    ACTIVE = "active"
    DRAINING = "draining"
    DISABLED = "disabled"


class PoolOut(BaseModel):
    name: str = Field(description="the pool's name (pools file or ISTHMUS_BACKENDS)")
    kind: str = Field(description="the adapter: slurm (whole nodes) or kubernetes (Kueue)")
    state: PoolState = Field(default=PoolState.ACTIVE, description="admin-set: only `active` pools get new jobs")
    healthy: bool = Field(description="false: jobs are not routed here until it recovers")
    reason: str = Field(description="why it is (un)healthy, in the backend's words")
    gpu_types: list[str] = Field(default_factory=list, description="GPU types it offers (configured, else seen)")
    weight: float = Field(default=1.0, description="routing weight: higher wins when several pools fit")
    cost: float = Field(default=1.0, description="default billing weight per GPU-second (cheaper pools first)")
    queue_depth: int = Field(default=0, description="gateway jobs submitted there and not started yet")
    total_nodes: int = 0
    idle_nodes: int = 0
    total_gpus: int = 0
    free_gpus: int = 0
    gpus_per_node: int = 0
    windows: list[WindowOut] = Field(default_factory=list, description="maintenances and reservations on it that "
                                     "have not ended, the gateway's and the backend's own (docs/planning.md)")
    topology: list[DomainOut] = Field(default_factory=list, description="its network domains at the last probe, "
                                      "every level; a job's `topology` names a level (docs/planning.md)")
    quarantined_nodes: list[str] = Field(default_factory=list, description="nodes the gateway places no gang on: "
                                         "their infrastructure failures ended jobs of several accounts, until an "
                                         "admin clears them (docs/recovery.md, \"Node health\")")


class DomainOut(BaseModel):
    level: str = Field(description="the pool's word for the level: `block`, `switch`, `rack`")
    name: str = Field(description="the backend's name for the domain")
    nodes: list[str] = Field(description="the pool's nodes in it")
    idle_nodes: int = Field(description="of those, idle at the last probe")


class PoolList(BaseModel):
    items: list[PoolOut]
    note: str = Field(default="", description="set when no pool is configured")


class PoolPatch(BaseModel):
    """What an administrator may change on a pool. The change wins over the pools file on later start-ups."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"state": "draining"},
                                                                             {"weight": 2.0}]})

    state: PoolState | None = Field(default=None, description="`draining`: no new jobs, running ones finish; "
                                                              "`disabled`: no new jobs; `active`: back in service.")
    weight: float | None = Field(default=None, gt=0, le=1000, description="Routing weight (> 0).")


class AdminPoolOut(BaseModel):
    name: str
    kind: str
    state: PoolState
    state_by: str = Field(description="who set the state (\"\": the configuration)")
    weight: float
    weight_by: str = Field(description="who set the weight (\"\": the configuration)")
    cost: float
    gpu_types: list[str]
    configured: bool = Field(description="false: no longer in the configuration (kept for history)")


class StoragePoolOut(BaseModel):
    pool: str
    provider: str = Field(description="`shared` (the pool's own shared file system has it at `path`), `pvc`, `nfs` "
                                      "or `host_path` (a volume the Kubernetes pool mounts)")
    healthy: bool | None = Field(default=None, description="admins only: whether the pool can give it now "
                                                           "(a Kubernetes claim exists and is bound); null: not asked")
    reason: str | None = Field(default=None, description="admins only: why not")


class StorageOut(BaseModel):
    name: str
    path: str = Field(description="where jobs see it, on every pool")
    mode: str = Field(description="`read-only` or `read-write`")
    tenancy: str = Field(description="`account`: each account sees only `<path>/<account>`; `shared`: all of it")
    pools: list[StoragePoolOut] = Field(description="the pools that provide it; jobs that mount it go only there")
    directories: dict[str, str] = Field(
        default_factory=dict, description="the caller's accounts that may use it -> the directory their jobs see")


class StorageList(BaseModel):
    items: list[StorageOut]


class WindowIn(BaseModel):
    """A maintenance window: from `start` to `end` the pool (or only `nodes` of it) runs nothing of the gateway's."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"start": "2026-12-08T06:00:00Z", "end": "2026-12-08T10:00:00Z", "reason": "kernel upgrade"},
        {"start": "2026-12-09T08:00:00Z", "end": "2026-12-09T09:00:00Z", "reason": "replace a GPU",
         "nodes": ["gpu-017"]}]})

    start: datetime = Field(description="When it starts (RFC 3339 with a time zone). May be in the past: a window "
                                        "that is already under way.")
    end: datetime = Field(description="When it ends (after `start`, in the future, at most 366 days after `start`).")
    reason: str = Field(min_length=1, max_length=200, description="Why, in words: shown to the users whose jobs wait.")
    nodes: list[Annotated[str, Field(pattern=NODE_NAME_RE)]] = Field(
        default_factory=list, max_length=1000, description="Only these nodes of the pool (host names); empty: the "
                                                            "whole pool.")


class WindowOut(BaseModel):
    id: str = Field(description="The gateway window's id, or the backend's own name for it (e.g. the Slurm "
                                "reservation's)")
    pool: str
    source: str = Field(description="`gateway` (made by an admin here, deletable here) or the backend's kind "
                                    "(`slurm`: a reservation in the cluster, shown as it is there)")
    start: datetime
    end: datetime | None = Field(description="null: no end set (a backend reservation without one)")
    maintenance: bool = Field(description="true: a maintenance; false: a reservation for someone else")
    nodes: list[str] = Field(description="the pool's nodes it takes; empty: the whole pool")
    reason: str
    active: bool = Field(description="true: under way now")
    words: str = Field(description="the window as a waiting job's reason names it")


PoolOut.model_rebuild()


class ReservationIn(BaseModel):
    """GPUs or nodes of a pool (or of the pool the gateway picks for a GPU type) held for an account."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"account": "team-a", "pool": "slurm-h100", "nodes": 8, "start": "2026-12-10T00:00:00Z",
         "end": "2026-12-12T00:00:00Z", "reason": "conference deadline"},
        {"account": "team-a", "gpu_type": "h100", "gpus": 64, "start": "2026-12-10T00:00:00Z",
         "end": "2026-12-12T00:00:00Z", "reason": "conference deadline"}]})

    account: str = Field(pattern=ACCOUNT_NAME_RE, description="Whose jobs may use it.")
    pool: str | None = Field(default=None, pattern=POOL_NAME_RE, description="The pool (or give `gpu_type`).")
    gpu_type: str | None = Field(default=None, pattern=GPU_TYPE_RE,
                                 description="Any pool offering this GPU type: the gateway picks the largest one "
                                             "where the amount fits, once, at creation.")
    gpus: int | None = Field(default=None, description="How many GPUs (or give `nodes`).")
    nodes: int | None = Field(default=None, description="How many whole nodes (or give `gpus`).")
    start: datetime = Field(description="When it starts (RFC 3339 with a time zone).")
    end: datetime = Field(description="When it ends (after `start`, in the future).")
    reason: str = Field(min_length=1, max_length=200, description="Why, in words: shown to others whose jobs wait.")


class ReservationOut(BaseModel):
    id: str
    account: str
    pool: str
    gpus: int | None
    nodes: int | None
    start: datetime
    end: datetime
    reason: str
    active: bool = Field(description="true: under way now")
    shortfall: str = Field(description="\"\" when the pool can honour it in full; else why not, with the shortfall "
                                       "(the pool lost nodes)")
    words: str = Field(description="the reservation as a waiting job's reason names it")
    created_by: str
    native: str | None = Field(default=None, description="The backend's own reservation of it, once the backend has "
                                                          "it (Slurm: `isthmus-hold-<id>`); null: the gateway's planner "
                                                          "holds it alone")
    native_note: str = Field(default="", description="What became of the backend's own reservation, in words "
                                                     "(made, not possible on this pool, or refused and retried)")
