"""The node-health record (issue #48): every ended attempt's nodes and outcome, and what the
gateway and its admins did about a node (cleared, drained or cordoned).

Expand only (docs/deploy.md, "Upgrades"): two new tables an older gateway never reads.

Revision ID: 0020nodes
Revises: 0019owner
Create Date: 2026-12-08
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020nodes'
down_revision = '0019owner'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'attempt_end',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
        sa.Column('job_id', sa.String(length=36), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('account_name', sa.String(length=63), nullable=False),
        sa.Column('pool', sa.String(length=63), nullable=False),
        sa.Column('nodes', sa.JSON(), nullable=False),
        sa.Column('failed_nodes', sa.JSON(), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('outcome', sa.String(length=32), nullable=False),
        sa.Column('charged_gpu_seconds', sa.BigInteger(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_attempt_end')),
        sa.UniqueConstraint('job_id', 'attempt', name='uq_attempt_end_job_attempt'),
    )
    op.create_index('ix_attempt_end_outcome_ended', 'attempt_end', ['outcome', 'ended_at'])
    op.create_table(
        'node_standing',
        sa.Column('pool', sa.String(length=63), nullable=False),
        sa.Column('node', sa.String(length=253), nullable=False),
        sa.Column('cleared_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('cleared_by', sa.String(length=255), nullable=False),
        sa.Column('suspect_since', sa.DateTime(timezone=True), nullable=True),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('drained_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('drain_error', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('pool', 'node', name=op.f('pk_node_standing')),
    )


def downgrade() -> None:
    op.drop_table('node_standing')
    op.drop_index('ix_attempt_end_outcome_ended', table_name='attempt_end')
    op.drop_table('attempt_end')
