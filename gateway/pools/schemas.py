"""Pools on the wire."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field


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
