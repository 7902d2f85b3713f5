"""Advance reservations: a pool's GPUs or nodes held for an account (issue #31, docs/planning.md).

No foreign keys, like the pool quotas and windows: the pool and the account are checked on
write, and deleting an account deletes its reservations (gateway/admin/lifecycle.py).

Revision ID: 0017holds
Revises: 0016windows
Create Date: 2026-12-06
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017holds'
down_revision = '0016windows'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'advance_reservation',
        sa.Column('id', sa.String(36), nullable=False),
        sa.Column('pool', sa.String(63), nullable=False),
        sa.Column('account', sa.String(63), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=True),
        sa.Column('nodes', sa.Integer(), nullable=True),
        sa.Column('starts_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ends_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('reason', sa.String(200), nullable=False),
        sa.Column('created_by', sa.String(255), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint('ends_at > starts_at', name=op.f('ck_advance_reservation_ends_after_start')),
        sa.CheckConstraint('(gpus IS NULL) <> (nodes IS NULL)', name=op.f('ck_advance_reservation_gpus_or_nodes')),
        sa.CheckConstraint('COALESCE(gpus, nodes) > 0', name=op.f('ck_advance_reservation_positive')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_advance_reservation')),
    )
    op.create_index('ix_advance_reservation_end', 'advance_reservation', ['ends_at'])


def downgrade() -> None:
    op.drop_index('ix_advance_reservation_end', table_name='advance_reservation')
    op.drop_table('advance_reservation')
