"""Maintenance windows an admin sets on a pool (issue #31, docs/planning.md).

No foreign key to `pool`: like the pool quotas, a window names a pool that the gateway
checks on write (a pool row is never deleted; a renamed pool keeps its history).

Revision ID: 0016windows
Revises: 0015liststate
Create Date: 2026-12-06
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016windows'
down_revision = '0015liststate'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'pool_window',
        sa.Column('id', sa.String(36), nullable=False),
        sa.Column('pool', sa.String(63), nullable=False),
        sa.Column('starts_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ends_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('reason', sa.String(200), nullable=False),
        sa.Column('nodes', sa.JSON(), nullable=False),
        sa.Column('created_by', sa.String(255), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint('ends_at > starts_at', name=op.f('ck_pool_window_ends_after_start')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_pool_window')),
    )
    op.create_index('ix_pool_window_pool_end', 'pool_window', ['pool', 'ends_at'])


def downgrade() -> None:
    op.drop_index('ix_pool_window_pool_end', table_name='pool_window')
    op.drop_table('pool_window')
