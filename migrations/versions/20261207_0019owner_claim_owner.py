"""The dispatch worker that holds a job's claim (issue #47, item 6): a dead worker's claims are
taken over as soon as its Postgres session lock is gone, not after the whole lease.

Expand only (docs/deploy.md, "Upgrades"): a nullable column that an older gateway neither
reads nor writes; its claims (NULL owner) are re-driven when their lease ends, as before.

Revision ID: 0019owner
Revises: 0018native
Create Date: 2026-12-07
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019owner'
down_revision = '0018native'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN on both databases: a batch copy of ``job`` would drop its triggers.
    op.add_column('job', sa.Column('claim_owner', sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column('job', 'claim_owner')
