"""Orphans: backend jobs that carry a gateway id the registry does not back (``GET /v1/admin/orphans``)."""

from __future__ import annotations

from sqlalchemy import select

from adapters.base import BackendError, Feature, features_of
from gateway.kit.db import transaction
from gateway.models.jobs import Job


def orphans(sessions, backends: dict) -> list[dict]:
    """Backend jobs carrying a gateway id the registry does not know, or that are not the
    backend job it recorded for that id (e.g. someone else's job with a copied comment)."""
    out: list[dict] = []
    for name, backend in backends.items():
        try:
            features_of(backend).require(Feature.LISTING)  # Unsupported says why, as an error
            listed = list(backend.list_gateway_jobs())
        except BackendError as exc:
            out.append({"backend": name, "error": exc.message})
            continue
        ids = [st.gateway_job_id for st in listed if st.gateway_job_id]
        with transaction(sessions) as s:
            known = dict(s.execute(select(Job.id, Job.backend_job_id).where(Job.id.in_(ids))).all()) \
                if ids else {}
        for st in listed:
            if not st.gateway_job_id:
                continue
            recorded = known.get(st.gateway_job_id, "")
            if st.gateway_job_id not in known or (recorded and recorded != st.backend_job_id):
                out.append({"backend": name, "backend_job_id": st.backend_job_id,
                            "gateway_job_id": st.gateway_job_id, "state": st.state.value})
    return out
