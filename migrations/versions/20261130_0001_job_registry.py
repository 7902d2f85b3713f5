"""job registry

Revision ID: 0001
Revises:
Create Date: 2026-11-30 08:40:46.285250
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('account',
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('parent_name', sa.String(length=63), nullable=True),
    sa.Column('shares', sa.Integer(), server_default='1', nullable=False),
    sa.Column('description', sa.Text(), server_default='', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint('shares >= 0', name=op.f('ck_account_shares_non_negative')),
    sa.ForeignKeyConstraint(['parent_name'], ['account.name'], name=op.f('fk_account_parent_name_account'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_account'))
    )
    with op.batch_alter_table('account', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_account_parent_name'), ['parent_name'], unique=False)

    op.create_table('job',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('submitted_by', sa.String(length=255), nullable=False),
    sa.Column('username', sa.String(length=32), nullable=False),
    sa.Column('requested_backend', sa.String(length=16), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('state_reason', sa.Text(), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('workers', sa.Integer(), nullable=False),
    sa.Column('gpus_per_worker', sa.Integer(), nullable=False),
    sa.Column('total_gpus', sa.Integer(), nullable=False),
    sa.Column('time_limit_s', sa.Integer(), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('backend_job_id', sa.String(length=128), nullable=True),
    sa.Column('routing_reason', sa.Text(), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('nodes', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('dispatch_attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_name'], ['account.name'], name=op.f('fk_job_account_name_account'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job'))
    )
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_account_id', ['account_name', 'id'], unique=False)
        batch_op.create_index('ix_job_state_priority', ['state', 'priority', 'id'], unique=False)

    op.create_table('idempotency_key',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('subject', sa.String(length=255), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_idempotency_key_job_id_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_idempotency_key')),
    sa.UniqueConstraint('subject', 'key', name='uq_idempotency_key_subject_key')
    )
    op.create_table('job_event',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=255), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('from_state', sa.String(length=16), nullable=True),
    sa.Column('to_state', sa.String(length=16), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_job_event_job_id_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_event'))
    )
    with op.batch_alter_table('job_event', schema=None) as batch_op:
        batch_op.create_index('ix_job_event_job', ['job_id', 'id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('job_event', schema=None) as batch_op:
        batch_op.drop_index('ix_job_event_job')

    op.drop_table('job_event')
    op.drop_table('idempotency_key')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_state_priority')
        batch_op.drop_index('ix_job_account_id')

    op.drop_table('job')
    with op.batch_alter_table('account', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_account_parent_name'))

    op.drop_table('account')
