"""indexes for the submit-time caps: a user's waiting jobs, a caller's recent idempotency keys

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""
from __future__ import annotations

from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_user_state', ['username', 'state', 'account_name'], unique=False)
    with op.batch_alter_table('idempotency_key', schema=None) as batch_op:
        batch_op.create_index('ix_idempotency_key_subject_created', ['subject', 'created_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('idempotency_key', schema=None) as batch_op:
        batch_op.drop_index('ix_idempotency_key_subject_created')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_user_state')
