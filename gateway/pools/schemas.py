"""Pools on the wire."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PoolOut(BaseModel):
    name: str = Field(description="the pool's name (the key in ISTHMUS_BACKENDS)")
    kind: str = Field(description="the adapter: slurm or kubernetes")
    healthy: bool = Field(description="false: jobs are not routed here until it recovers")
    reason: str = Field(description="why it is (un)healthy, in the backend's words")
    total_nodes: int = 0
    idle_nodes: int = 0
    total_gpus: int = 0
    free_gpus: int = 0
    gpus_per_node: int = 0


class PoolList(BaseModel):
    items: list[PoolOut]
    note: str = Field(default="", description="set when no pool is configured")
