"""Guaranteed and borrowed GPUs, reclaim and checkpoint reports (issue #30, docs/recovery.md):
guarantees beside the limits, whether a job's attempt runs borrowed, when it last reported a
checkpoint, the preemptions the gateway made, and the secrets the gateway keeps itself.

Revision ID: 0013reclaim
Revises: 0012attempts
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013reclaim'
down_revision = '0012attempts'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('account_quota') as batch:
        batch.add_column(sa.Column('guaranteed_gpus', sa.Integer(), nullable=True))
        batch.create_check_constraint('guaranteed_gpus_non_negative', 'guaranteed_gpus IS NULL OR guaranteed_gpus >= 0')
    with op.batch_alter_table('account_pool_quota') as batch:
        batch.add_column(sa.Column('guaranteed_gpus', sa.Integer(), nullable=True))
        batch.create_check_constraint('guaranteed_gpus_non_negative', 'guaranteed_gpus IS NULL OR guaranteed_gpus >= 0')
    with op.batch_alter_table('job') as batch:
        batch.add_column(sa.Column('borrowed', sa.Boolean(), nullable=True))
        batch.add_column(sa.Column('checkpoint_at', sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        'job_preemption',
        sa.Column('job_id', sa.String(36), sa.ForeignKey('job.id', ondelete='CASCADE'), primary_key=True),
        sa.Column('attempt', sa.Integer(), primary_key=True),
        sa.Column('pool', sa.String(63), nullable=False),
        sa.Column('preemptor_id', sa.String(36), sa.ForeignKey('job.id', ondelete='SET NULL'), nullable=True),
        sa.Column('preemptor_account', sa.String(63), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=False),
        sa.Column('gpu_hours_at_risk', sa.Float(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('chosen_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('deadline', sa.DateTime(timezone=True), nullable=False),
        sa.Column('signalled_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index('ix_job_preemption_ended', 'job_preemption', ['ended_at'])
    op.create_index('ix_job_preemption_chosen', 'job_preemption', ['chosen_at'])
    op.create_table(
        'gateway_secret',
        sa.Column('name', sa.String(63), primary_key=True),
        sa.Column('value', sa.String(255), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('gateway_secret')
    op.drop_index('ix_job_preemption_chosen', table_name='job_preemption')
    op.drop_index('ix_job_preemption_ended', table_name='job_preemption')
    op.drop_table('job_preemption')
    with op.batch_alter_table('job') as batch:
        batch.drop_column('checkpoint_at')
        batch.drop_column('borrowed')
    with op.batch_alter_table('account_pool_quota') as batch:
        batch.drop_constraint('guaranteed_gpus_non_negative', type_='check')
        batch.drop_column('guaranteed_gpus')
    with op.batch_alter_table('account_quota') as batch:
        batch.drop_constraint('guaranteed_gpus_non_negative', type_='check')
        batch.drop_column('guaranteed_gpus')
