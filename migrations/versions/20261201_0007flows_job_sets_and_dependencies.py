"""Job sets (arrays, sweeps), a job's place in one, and dependencies between jobs (issue #16)

Revision ID: 0007flows
Revises: 0006
Create Date: 2026-12-01
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007flows'
down_revision = '0006'
branch_labels = None
depends_on = None

_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _restore_queue_index() -> None:
    """SQLite's batch mode rebuilds the job table and loses the DESC of this expression index."""
    if op.get_bind().dialect.name == 'sqlite':
        op.drop_index('ix_job_queue', table_name='job')
        op.create_index('ix_job_queue', 'job', ['state', 'account_name', sa.text('priority DESC'), 'id'], unique=False)


def upgrade() -> None:
    op.create_table(
        'job_set',
        sa.Column('id', sa.String(length=36), nullable=False),
        sa.Column('name', sa.String(length=63), nullable=False),
        sa.Column('account_name', sa.String(length=63), nullable=False),
        sa.Column('submitted_by', sa.String(length=255), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('task_count', sa.Integer(), nullable=False),
        sa.Column('max_running', sa.Integer(), nullable=True),
        sa.Column('sweep', sa.JSON(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['account_name'], ['account.name'], name=op.f('fk_job_set_account_name_account'),
                                ondelete='RESTRICT'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_job_set')),
    )
    op.create_index('ix_job_set_account_id', 'job_set', ['account_name', 'id'], unique=False)
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('job_set_id', sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column('array_index', sa.Integer(), nullable=True))
        batch_op.create_foreign_key(batch_op.f('fk_job_job_set_id_job_set'), 'job_set', ['job_set_id'], ['id'],
                                    ondelete='RESTRICT')
        batch_op.create_index('ix_job_set_state', ['job_set_id', 'state', 'array_index'], unique=False)
    _restore_queue_index()
    op.create_table(
        'job_dependency',
        sa.Column('id', _BIGINT, autoincrement=True, nullable=False),
        sa.Column('job_id', sa.String(length=36), nullable=False),
        sa.Column('on_job_id', sa.String(length=36), nullable=True),
        sa.Column('on_set_id', sa.String(length=36), nullable=True),
        sa.Column('condition', sa.String(length=16), nullable=False),
        sa.CheckConstraint('(on_job_id IS NULL) <> (on_set_id IS NULL)', name=op.f('ck_job_dependency_one_target')),
        sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_job_dependency_job_id_job'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['on_job_id'], ['job.id'], name=op.f('fk_job_dependency_on_job_id_job'),
                                ondelete='RESTRICT'),
        sa.ForeignKeyConstraint(['on_set_id'], ['job_set.id'], name=op.f('fk_job_dependency_on_set_id_job_set'),
                                ondelete='RESTRICT'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_job_dependency')),
    )
    op.create_index('ix_job_dependency_job', 'job_dependency', ['job_id'], unique=False)
    op.create_index('ix_job_dependency_on_job', 'job_dependency', ['on_job_id'], unique=False)
    op.create_index('ix_job_dependency_on_set', 'job_dependency', ['on_set_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_job_dependency_on_set', table_name='job_dependency')
    op.drop_index('ix_job_dependency_on_job', table_name='job_dependency')
    op.drop_index('ix_job_dependency_job', table_name='job_dependency')
    op.drop_table('job_dependency')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_set_state')
        batch_op.drop_constraint(batch_op.f('fk_job_job_set_id_job_set'), type_='foreignkey')
        batch_op.drop_column('array_index')
        batch_op.drop_column('job_set_id')
    _restore_queue_index()
    op.drop_index('ix_job_set_account_id', table_name='job_set')
    op.drop_table('job_set')
