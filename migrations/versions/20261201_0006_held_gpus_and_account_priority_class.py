"""GPUs a job holds on its pool (whole nodes on node-exclusive pools), and the admin-set
Kueue priority class of an account

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('held_gpus', sa.Integer(), nullable=True))
    with op.batch_alter_table('account', schema=None) as batch_op:
        batch_op.add_column(sa.Column('priority_class', sa.String(length=253), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('account', schema=None) as batch_op:
        batch_op.drop_column('priority_class')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_column('held_gpus')
