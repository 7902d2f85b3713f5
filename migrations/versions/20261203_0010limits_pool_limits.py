"""A pool's static limits as the dispatcher last saw them (GPU types, GPUs, memory and CPUs
per node, nodes, total GPUs, container support), so a gateway process that runs no
dispatcher (``isthmus serve`` beside ``isthmus worker``) refuses a job that can never fit a
pool at submit time, as the process with the dispatcher does (issue #28).

Revision ID: 0010limits
Revises: 0009pool
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010limits'
down_revision = '0009pool'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pool') as batch:
        batch.add_column(sa.Column('limits', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('limits_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pool') as batch:
        batch.drop_column('limits_at')
        batch.drop_column('limits')
