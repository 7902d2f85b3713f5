"""One word for one thing: the job's ``backend`` and ``requested_backend`` columns hold a pool
(the one it was routed to; ``auto`` or the one asked for), so they are ``pool`` and
``requested_pool``. No index or constraint name carries the old word; the API keeps its
deprecated ``backend`` / ``assigned_backend`` fields (gateway/jobs/schemas.py).

A plain column rename on both databases (SQLite >= 3.25 renames in place, so the table and
its expression index ``ix_job_queue`` are not rebuilt); values are untouched.

Revision ID: 0009pool
Revises: 0008hooks
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009pool'
down_revision = '0008hooks'
branch_labels = None
depends_on = None

# (old, new, nullable)
RENAMES = (('requested_backend', 'requested_pool', False), ('backend', 'pool', True))


def upgrade() -> None:
    for old, new, nullable in RENAMES:
        op.alter_column('job', old, new_column_name=new, existing_type=sa.String(length=63),
                        existing_nullable=nullable)


def downgrade() -> None:
    for old, new, nullable in RENAMES:
        op.alter_column('job', new, new_column_name=old, existing_type=sa.String(length=63),
                        existing_nullable=nullable)
