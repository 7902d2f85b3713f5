"""Advance reservations the backend holds too (a Slurm reservation the gateway makes), and the
one a job's attempt runs in (issue #31, docs/planning.md).

Revision ID: 0018native
Revises: 0017holds
Create Date: 2026-12-06
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018native'
down_revision = '0017holds'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN on both databases: a batch copy of ``job`` would drop its triggers.
    op.add_column('advance_reservation', sa.Column('native', sa.String(80), nullable=True))
    op.add_column('advance_reservation', sa.Column('native_note', sa.String(500), nullable=False,
                                                   server_default=''))
    op.add_column('job', sa.Column('backend_reservation', sa.String(80), nullable=True))


def downgrade() -> None:
    op.drop_column('job', 'backend_reservation')
    op.drop_column('advance_reservation', 'native_note')
    op.drop_column('advance_reservation', 'native')
