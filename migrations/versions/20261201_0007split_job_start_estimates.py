"""A pending job's estimated start: the planned start, pool and reason from the last dispatch round

Revision ID: 0007split
Revises: 0007pools
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007split'
down_revision = '0007pools'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('estimated_start', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('estimated_pool', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('estimate_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_column('estimate_reason')
        batch_op.drop_column('estimated_pool')
        batch_op.drop_column('estimated_start')
