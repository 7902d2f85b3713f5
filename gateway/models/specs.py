"""A job's full spec: the one way to read it (issue #27 finding 3).

Next to the tables it reads (``job.spec``, ``job_set.spec``), below every package that reads
a spec: the ledger, dispatch, jobs and flows (tests/layout). The rendering itself is pure
(gateway/domain/templates.py).

A single job keeps its normalised spec in ``job.spec``. A task of an array or sweep keeps
only its own values there (``{}`` for an array's task, whose only value is its index,
``{"parameters": {...}}`` for a sweep's); the spec is stored once on its set
(``job_set.spec``, with ``command`` and ``env`` as templates) and rendered here with the
task's values, exactly as the task would have been written whole. Tasks written before
that (their ``job.spec`` has a ``command``) are read as they are.

Every reader of a job's spec goes through :func:`spec_of`, or :func:`field_of` for a field
no template touches (the ledger's ``gpu_type``, routing's shape): no rendering then. The
set's template is read once per session (a request, a dispatch round) and kept in
``session.info``; a set's spec never changes, so the copy cannot go stale.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from gateway.domain.routing import JobShape
from gateway.domain.templates import RENDERED, Template
from gateway.models.flows import JobSet

_CACHE = "isthmus.flows.set_templates"


def _stored_whole(job: Any) -> bool:
    return getattr(job, "job_set_id", None) is None or "command" in (job.spec or {})


def template_of(session: Session, set_id: str) -> Template:
    """The set's template, read once per session."""
    cache: dict[str, Template] = session.info.setdefault(_CACHE, {})
    template = cache.get(set_id)
    if template is None:
        spec, count = session.execute(select(JobSet.spec, JobSet.task_count).where(JobSet.id == set_id)).one()
        template = cache[set_id] = Template(spec, count)
    return template


def _template(job: Any, session: Session | None) -> Template:
    session = session or object_session(job)
    if session is None:
        raise RuntimeError(f"job {job.id}: a set task's spec needs a session to read its set's")
    return template_of(session, job.job_set_id)


def spec_of(job: Any, session: Session | None = None) -> dict[str, Any]:
    """The job's full normalised spec, as submitted (for a set's task: rendered with its values).

    ``session`` defaults to the job's own (an ORM object loaded in one).
    """
    if _stored_whole(job):
        return job.spec or {}
    return _template(job, session).render(job.spec or {}, job.array_index)


def shared_of(job: Any, session: Session | None = None) -> dict[str, Any]:
    """:func:`spec_of` without rendering: right for every field but ``command``, ``env`` and
    ``parameters`` (:data:`RENDERED`), which a set's tasks do not share. Do not read those from it."""
    if _stored_whole(job):
        return job.spec or {}
    return _template(job, session).spec


def field_of(job: Any, key: str, session: Session | None = None) -> Any:
    """One field of :func:`spec_of` that no template touches, without rendering (None when absent)."""
    if key in RENDERED:
        raise ValueError(f"{key!r} differs between a set's tasks: use spec_of")
    return shared_of(job, session).get(key)


def checkpoint_dir_of(job: Any, storage: Any) -> str | None:
    """The job's ``ISTHMUS_CHECKPOINT_DIR`` (docs/storage.md), or None without a checkpoint
    (or when its storage is no longer configured). ``storage``: the storage catalog."""
    from gateway.domain.storage import checkpoint_dir

    kept = field_of(job, "checkpoint")
    found = storage.get(kept["storage"]) if kept and storage is not None else None
    return checkpoint_dir(found, job.account_name, job.checkpoint_lineage) if found is not None else None


def shape_of(job: Any) -> JobShape:
    """The job's shape; jobs of one shape share one object (a round's many jobs have few
    shapes, and the memos keyed by shape then match by identity, not field by field)."""
    spec = shared_of(job)  # the shape's fields are the same for every task of a set
    key = (job.workers, job.gpus_per_worker, job.total_gpus, spec.get("image"), spec.get("gpu_type"),
           spec.get("memory_per_worker"), spec.get("cpus_per_worker"), spec.get("pool_kind"),
           json.dumps(spec["mounts"], sort_keys=True) if spec.get("mounts") else None,
           spec["checkpoint"].get("storage") if spec.get("checkpoint") else None,
           json.dumps(spec["topology"], sort_keys=True) if spec.get("topology") else None)
    try:
        shape = _SHAPES.get(key)
    except TypeError:  # an unhashable field in an old spec: not shared
        key = shape = None
    if shape is None:
        shape = JobShape.of_spec(workers=job.workers, gpus_per_worker=job.gpus_per_worker, total_gpus=job.total_gpus,
                                 spec=spec)
        if key is not None:
            if len(_SHAPES) >= 4096:
                _SHAPES.clear()
            _SHAPES[key] = shape
    return shape


# The raw fields of a job's shape -> its JobShape (bounded: cleared when full).
_SHAPES: dict[tuple, JobShape] = {}
