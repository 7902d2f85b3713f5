"""/ui login sessions kept server-side: the cookie holds only a random id (#27, finding 9)

Revision ID: 0008ui
Revises: 0008sets
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008ui'
down_revision = '0008sets'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'ui_session',
        sa.Column('id_hash', sa.String(length=64), nullable=False),
        sa.Column('access_token', sa.Text(), nullable=False),
        sa.Column('csrf', sa.String(length=64), nullable=False),
        sa.Column('subject', sa.String(length=255), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id_hash', name=op.f('pk_ui_session')),
    )
    op.create_index('ix_ui_session_expires_at', 'ui_session', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_ui_session_expires_at', table_name='ui_session')
    op.drop_table('ui_session')
