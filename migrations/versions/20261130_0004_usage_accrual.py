"""usage accrual while running, and the last requeue time, on ledger_reservation

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ledger_reservation', schema=None) as batch_op:
        batch_op.add_column(sa.Column('accrued_gpu_seconds', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('accrued_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('requeued_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ledger_reservation', schema=None) as batch_op:
        batch_op.drop_column('requeued_at')
        batch_op.drop_column('accrued_at')
        batch_op.drop_column('accrued_gpu_seconds')
