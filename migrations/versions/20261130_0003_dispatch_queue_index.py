"""dispatch queue index: (state, account_name, priority DESC, id)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_state_priority')
        batch_op.create_index('ix_job_queue', ['state', 'account_name', sa.text('priority DESC'), 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_queue')
        batch_op.create_index('ix_job_state_priority', ['state', 'priority', 'id'], unique=False)
