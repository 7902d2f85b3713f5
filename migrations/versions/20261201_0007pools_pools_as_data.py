"""Pools as data: a ``pool`` table, per-pool quotas and balances as rows, pool names up to 63

The two pools the gateway used to know become rows named ``slurm`` and ``kubernetes``;
``account_quota.max_gpus_{slurm,kubernetes}`` become ``account_pool_quota`` rows and
``account_balance.reserved_gpus_{slurm,kubernetes}`` become ``account_pool_balance`` rows
(only non-null limits and non-zero balances). Columns holding a pool name widen from 16 to
63 characters (a DNS label). Downgrade moves the two old pools' rows back into columns;
other pools' rows cannot be represented there and are dropped (refused if a job still
holds GPUs on one: that would lose its balance).

Revision ID: 0007pools
Revises: 0007hooks
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007pools'
down_revision = '0007hooks'
branch_labels = None
depends_on = None

OLD_POOLS = ('slurm', 'kubernetes')
# (table, column, nullable) of every column holding a pool name.
POOL_COLUMNS = (('job', 'requested_backend', False), ('job', 'backend', True), ('ledger_entry', 'pool', True),
                ('ledger_reservation', 'pool', False), ('usage_bucket', 'pool', False),
                ('gpu_billing_weight', 'pool', False))


def _widen(length_from: int, length_to: int) -> None:
    sqlite = op.get_bind().dialect.name == 'sqlite'
    for table in dict.fromkeys(t for t, _, _ in POOL_COLUMNS):
        with op.batch_alter_table(table, schema=None) as batch_op:
            for t, column, nullable in POOL_COLUMNS:
                if t == table:
                    batch_op.alter_column(column, existing_type=sa.String(length=length_from),
                                          type_=sa.String(length=length_to), existing_nullable=nullable)
        if sqlite and table == 'job':
            # SQLite's batch mode rebuilds the table and cannot reflect the expression index.
            op.execute('DROP INDEX IF EXISTS ix_job_queue')
            op.create_index('ix_job_queue', 'job', ['state', 'account_name', sa.text('priority DESC'), 'id'],
                            unique=False)


def upgrade() -> None:
    pool = op.create_table(
        'pool',
        sa.Column('name', sa.String(length=63), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('gpu_types', sa.JSON(), nullable=False),
        sa.Column('weight', sa.Float(), server_default='1', nullable=False),
        sa.Column('cost', sa.Float(), server_default='1', nullable=False),
        sa.Column('state', sa.String(length=16), server_default='active', nullable=False),
        sa.Column('state_by', sa.String(length=255), server_default='', nullable=False),
        sa.Column('weight_by', sa.String(length=255), server_default='', nullable=False),
        sa.Column('configured', sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('slurm', 'kubernetes')", name=op.f('ck_pool_kind_known')),
        sa.CheckConstraint("state IN ('active', 'draining', 'disabled')", name=op.f('ck_pool_state_known')),
        sa.CheckConstraint('weight > 0', name=op.f('ck_pool_weight_positive')),
        sa.CheckConstraint('cost > 0 AND cost <= 1000', name=op.f('ck_pool_cost_range')),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_pool')),
    )
    op.create_table(
        'account_pool_quota',
        sa.Column('account_name', sa.String(length=63), nullable=False),
        sa.Column('pool', sa.String(length=63), nullable=False),
        sa.Column('max_gpus', sa.Integer(), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_by', sa.String(length=255), nullable=False),
        sa.CheckConstraint('max_gpus IS NULL OR max_gpus >= 0', name=op.f('ck_account_pool_quota_max_gpus_non_negative')),
        sa.ForeignKeyConstraint(['account_name'], ['account.name'],
                                name=op.f('fk_account_pool_quota_account_name_account'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('account_name', 'pool', name='pk_account_pool_quota'),
    )
    op.create_table(
        'account_pool_balance',
        sa.Column('account_name', sa.String(length=63), nullable=False),
        sa.Column('pool', sa.String(length=63), nullable=False),
        sa.Column('reserved_gpus', sa.Integer(), server_default='0', nullable=False),
        sa.ForeignKeyConstraint(['account_name'], ['account.name'],
                                name=op.f('fk_account_pool_balance_account_name_account'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('account_name', 'pool', name='pk_account_pool_balance'),
    )
    now = sa.func.now() if op.get_bind().dialect.name == 'postgresql' else sa.text("CURRENT_TIMESTAMP")
    conn = op.get_bind()
    for name in OLD_POOLS:
        conn.execute(pool.insert().values(name=name, kind=name, gpu_types=[], created_at=now, updated_at=now))
    for name in OLD_POOLS:
        conn.execute(sa.text(
            f"INSERT INTO account_pool_quota (account_name, pool, max_gpus, updated_at, updated_by) "
            f"SELECT account_name, '{name}', max_gpus_{name}, updated_at, updated_by FROM account_quota "
            f"WHERE max_gpus_{name} IS NOT NULL"))
        conn.execute(sa.text(
            f"INSERT INTO account_pool_balance (account_name, pool, reserved_gpus) "
            f"SELECT account_name, '{name}', reserved_gpus_{name} FROM account_balance "
            f"WHERE reserved_gpus_{name} <> 0"))
    with op.batch_alter_table('account_quota', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_account_quota_max_gpus_slurm_non_negative'), type_='check')
        batch_op.drop_constraint(op.f('ck_account_quota_max_gpus_kubernetes_non_negative'), type_='check')
        batch_op.drop_column('max_gpus_kubernetes')
        batch_op.drop_column('max_gpus_slurm')
    with op.batch_alter_table('account_balance', schema=None) as batch_op:
        batch_op.drop_column('reserved_gpus_kubernetes')
        batch_op.drop_column('reserved_gpus_slurm')
    _widen(16, 63)


def downgrade() -> None:
    conn = op.get_bind()
    stranded = conn.execute(sa.text(
        "SELECT pool, COUNT(*) FROM ledger_reservation WHERE status IN ('reserved', 'started') "
        "AND pool NOT IN ('slurm', 'kubernetes') GROUP BY pool")).all()
    if stranded:
        raise RuntimeError("cannot downgrade below 0007pools: jobs hold GPUs in pools the old schema cannot "
                           "name: " + ", ".join(f"{p} ({n})" for p, n in stranded))
    too_long = conn.execute(sa.text(
        "SELECT COUNT(*) FROM job WHERE LENGTH(requested_backend) > 16 OR LENGTH(backend) > 16")).scalar()
    if too_long:
        raise RuntimeError(f"cannot downgrade below 0007pools: {too_long} job(s) name a pool longer than 16 "
                           "characters")
    for table, column, _ in POOL_COLUMNS:
        if table != 'job':  # history of other pools: cut to fit (job rows were refused above)
            conn.execute(sa.text(f"UPDATE {table} SET {column} = SUBSTR({column}, 1, 16) "
                                 f"WHERE LENGTH({column}) > 16"))
    conn.execute(sa.text("DELETE FROM gpu_billing_weight WHERE pool NOT IN ('slurm', 'kubernetes')"))
    _widen(63, 16)
    with op.batch_alter_table('account_balance', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reserved_gpus_slurm', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('reserved_gpus_kubernetes', sa.Integer(), server_default='0',
                                      nullable=False))
    with op.batch_alter_table('account_quota', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_gpus_slurm', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('max_gpus_kubernetes', sa.Integer(), nullable=True))
        batch_op.create_check_constraint(op.f('ck_account_quota_max_gpus_slurm_non_negative'),
                                         'max_gpus_slurm IS NULL OR max_gpus_slurm >= 0')
        batch_op.create_check_constraint(op.f('ck_account_quota_max_gpus_kubernetes_non_negative'),
                                         'max_gpus_kubernetes IS NULL OR max_gpus_kubernetes >= 0')
    for name in OLD_POOLS:
        conn.execute(sa.text(
            f"UPDATE account_quota SET max_gpus_{name} = (SELECT q.max_gpus FROM account_pool_quota q "
            f"WHERE q.account_name = account_quota.account_name AND q.pool = '{name}')"))
        conn.execute(sa.text(
            f"UPDATE account_balance SET reserved_gpus_{name} = COALESCE((SELECT b.reserved_gpus FROM "
            f"account_pool_balance b WHERE b.account_name = account_balance.account_name AND b.pool = '{name}'), 0)"))
    op.drop_table('account_pool_balance')
    op.drop_table('account_pool_quota')
    op.drop_table('pool')
