"""The audit log (issue #49, item 4): one hash-chained row per privileged change.

Expand only (docs/deploy.md, "Upgrades"): a new table an older gateway never reads (it
writes no records either: changes made through an older replica during a rolling upgrade
are not in the log).

Revision ID: 0021audit
Revises: 0020nodes
Create Date: 2026-12-08
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021audit'
down_revision = '0020nodes'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'audit_record',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('subject', sa.String(length=255), nullable=False),
        sa.Column('username', sa.String(length=64), nullable=False),
        sa.Column('request_id', sa.String(length=64), nullable=False),
        sa.Column('action', sa.String(length=64), nullable=False),
        sa.Column('target_kind', sa.String(length=32), nullable=False),
        sa.Column('target_name', sa.String(length=255), nullable=False),
        sa.Column('account', sa.String(length=63), nullable=True),
        sa.Column('before', sa.JSON(), nullable=True),
        sa.Column('after', sa.JSON(), nullable=True),
        sa.Column('prev_hash', sa.String(length=64), nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_record')),
    )
    op.create_index('ix_audit_record_account_id', 'audit_record', ['account', 'id'])
    op.create_index('ix_audit_record_at', 'audit_record', ['at'])


def downgrade() -> None:
    op.drop_index('ix_audit_record_at', table_name='audit_record')
    op.drop_index('ix_audit_record_account_id', table_name='audit_record')
    op.drop_table('audit_record')
