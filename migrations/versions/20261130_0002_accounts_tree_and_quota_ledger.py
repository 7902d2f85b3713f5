"""accounts tree (members, quotas) and the quota ledger (issue 6)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 08:43:40.569650
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('fairshare_usage',
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('decayed_gpu_seconds', sa.Float(), nullable=False),
    sa.Column('decayed_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('account_name', name=op.f('pk_fairshare_usage'))
    )
    op.create_table('gpu_billing_weight',
    sa.Column('pool', sa.String(length=16), nullable=False),
    sa.Column('gpu_type', sa.String(length=32), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('weight > 0 AND weight <= 1000', name=op.f('ck_gpu_billing_weight_weight_range')),
    sa.PrimaryKeyConstraint('pool', 'gpu_type', name='pk_gpu_billing_weight')
    )
    op.create_table('ledger_entry',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=True),
    sa.Column('pool', sa.String(length=16), nullable=True),
    sa.Column('gpu_type', sa.String(length=32), nullable=True),
    sa.Column('username', sa.String(length=32), nullable=True),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('committed_gpu_seconds', sa.BigInteger(), nullable=False),
    sa.Column('gpu_seconds', sa.BigInteger(), nullable=False),
    sa.Column('billing_weight', sa.Float(), nullable=False),
    sa.Column('actor', sa.String(length=255), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=True),
    sa.CheckConstraint("kind IN ('reserve', 'start', 'usage', 'release', 'refund', 'credit', 'debit')", name=op.f('ck_ledger_entry_kind_known')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger_entry'))
    )
    with op.batch_alter_table('ledger_entry', schema=None) as batch_op:
        batch_op.create_index('ix_ledger_entry_account_id', ['account_name', 'id'], unique=False)
        batch_op.create_index('ix_ledger_entry_at', ['at'], unique=False)
        batch_op.create_index('ix_ledger_entry_job_id', ['job_id', 'id'], unique=False)

    op.create_table('ledger_reservation',
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('username', sa.String(length=32), nullable=False),
    sa.Column('pool', sa.String(length=16), nullable=False),
    sa.Column('gpu_type', sa.String(length=32), nullable=True),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('time_limit_s', sa.Integer(), nullable=False),
    sa.Column('billing_weight', sa.Float(), nullable=False),
    sa.Column('committed_gpu_seconds', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reserved_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('used_gpu_seconds', sa.BigInteger(), nullable=False),
    sa.CheckConstraint("status IN ('reserved', 'started', 'finished', 'released')", name=op.f('ck_ledger_reservation_status_known')),
    sa.PrimaryKeyConstraint('job_id', name=op.f('pk_ledger_reservation'))
    )
    with op.batch_alter_table('ledger_reservation', schema=None) as batch_op:
        batch_op.create_index('ix_ledger_reservation_account_status', ['account_name', 'status'], unique=False)
        batch_op.create_index('ix_ledger_reservation_user_status', ['username', 'status'], unique=False)

    op.create_table('usage_bucket',
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('day', sa.Date(), nullable=False),
    sa.Column('pool', sa.String(length=16), nullable=False),
    sa.Column('gpu_seconds', sa.BigInteger(), nullable=False),
    sa.Column('usage_gpu_seconds', sa.BigInteger(), nullable=False),
    sa.Column('adjustment_gpu_seconds', sa.BigInteger(), nullable=False),
    sa.Column('jobs', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('account_name', 'day', 'pool', name='pk_usage_bucket')
    )
    op.create_table('account_balance',
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('reserved_gpus', sa.Integer(), server_default='0', nullable=False),
    sa.Column('reserved_gpus_slurm', sa.Integer(), server_default='0', nullable=False),
    sa.Column('reserved_gpus_kubernetes', sa.Integer(), server_default='0', nullable=False),
    sa.Column('committed_gpu_seconds', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('charged_gpu_seconds', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('queued_jobs', sa.Integer(), server_default='0', nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['account_name'], ['account.name'], name=op.f('fk_account_balance_account_name_account'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('account_name', name=op.f('pk_account_balance'))
    )
    op.create_table('account_member',
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('username', sa.String(length=32), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("role IN ('member', 'coordinator')", name=op.f('ck_account_member_role_known')),
    sa.ForeignKeyConstraint(['account_name'], ['account.name'], name=op.f('fk_account_member_account_name_account'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('account_name', 'username', name='pk_account_member')
    )
    with op.batch_alter_table('account_member', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_account_member_username'), ['username'], unique=False)

    op.create_table('account_quota',
    sa.Column('account_name', sa.String(length=63), nullable=False),
    sa.Column('max_gpus', sa.Integer(), nullable=True),
    sa.Column('max_gpus_slurm', sa.Integer(), nullable=True),
    sa.Column('max_gpus_kubernetes', sa.Integer(), nullable=True),
    sa.Column('budget_gpu_seconds', sa.BigInteger(), nullable=True),
    sa.Column('budget_period', sa.String(length=16), server_default='month', nullable=False),
    sa.Column('budget_window_days', sa.Integer(), server_default='30', nullable=False),
    sa.Column('max_queued_jobs', sa.Integer(), nullable=True),
    sa.Column('max_queued_jobs_per_user', sa.Integer(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_by', sa.String(length=255), nullable=False),
    sa.CheckConstraint("budget_period IN ('month', 'rolling')", name=op.f('ck_account_quota_budget_period_known')),
    sa.CheckConstraint('budget_gpu_seconds IS NULL OR budget_gpu_seconds >= 0', name=op.f('ck_account_quota_budget_non_negative')),
    sa.CheckConstraint('budget_window_days >= 1', name=op.f('ck_account_quota_budget_window_positive')),
    sa.CheckConstraint('max_gpus IS NULL OR max_gpus >= 0', name=op.f('ck_account_quota_max_gpus_non_negative')),
    sa.CheckConstraint('max_gpus_kubernetes IS NULL OR max_gpus_kubernetes >= 0', name=op.f('ck_account_quota_max_gpus_kubernetes_non_negative')),
    sa.CheckConstraint('max_gpus_slurm IS NULL OR max_gpus_slurm >= 0', name=op.f('ck_account_quota_max_gpus_slurm_non_negative')),
    sa.CheckConstraint('max_queued_jobs IS NULL OR max_queued_jobs >= 0', name=op.f('ck_account_quota_max_queued_non_negative')),
    sa.CheckConstraint('max_queued_jobs_per_user IS NULL OR max_queued_jobs_per_user >= 0', name=op.f('ck_account_quota_max_queued_per_user_non_negative')),
    sa.ForeignKeyConstraint(['account_name'], ['account.name'], name=op.f('fk_account_quota_account_name_account'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('account_name', name=op.f('pk_account_quota'))
    )
    # Existing accounts get their (zero) running totals; new ones get theirs on creation.
    op.execute("INSERT INTO account_balance (account_name) SELECT name FROM account")


def downgrade() -> None:
    op.drop_table('account_quota')
    with op.batch_alter_table('account_member', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_account_member_username'))

    op.drop_table('account_member')
    op.drop_table('account_balance')
    op.drop_table('usage_bucket')
    with op.batch_alter_table('ledger_reservation', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_reservation_user_status')
        batch_op.drop_index('ix_ledger_reservation_account_status')

    op.drop_table('ledger_reservation')
    with op.batch_alter_table('ledger_entry', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_entry_job_id')
        batch_op.drop_index('ix_ledger_entry_at')
        batch_op.drop_index('ix_ledger_entry_account_id')

    op.drop_table('ledger_entry')
    op.drop_table('gpu_billing_weight')
    op.drop_table('fairshare_usage')
