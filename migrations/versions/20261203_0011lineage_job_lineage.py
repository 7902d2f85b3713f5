"""A job's checkpoint lineage: the job whose checkpoint directory it uses (itself, or the
first job of a ``resume_from`` chain), so every retry, requeue, move and resumption of it
finds the same ``ISTHMUS_CHECKPOINT_DIR`` (issue #29, docs/storage.md).

Revision ID: 0011lineage
Revises: 0010limits
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011lineage'
down_revision = '0010limits'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job') as batch:
        batch.add_column(sa.Column('lineage', sa.String(36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job') as batch:
        batch.drop_column('lineage')
