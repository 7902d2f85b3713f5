"""A job's attempts (issue #30, docs/recovery.md): the job's current attempt number, and one
row per attempt that ended and was run again (where it ran, why it ended, what it was charged).

Revision ID: 0012attempts
Revises: 0011lineage
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012attempts'
down_revision = '0011lineage'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job') as batch:
        batch.add_column(sa.Column('attempt', sa.Integer(), nullable=False, server_default='1'))
    op.create_table(
        'job_attempt',
        sa.Column('job_id', sa.String(36), sa.ForeignKey('job.id', ondelete='CASCADE'), primary_key=True),
        sa.Column('number', sa.Integer(), primary_key=True),
        sa.Column('pool', sa.String(63), nullable=True),
        sa.Column('backend_job_id', sa.String(128), nullable=True),
        sa.Column('nodes', sa.JSON(), nullable=True),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('outcome', sa.String(32), nullable=False),
        sa.Column('exit_code', sa.Integer(), nullable=True),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('charged_gpu_seconds', sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('job_attempt')
    with op.batch_alter_table('job') as batch:
        batch.drop_column('attempt')
