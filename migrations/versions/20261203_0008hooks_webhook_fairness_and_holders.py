"""Webhooks: one attempt in flight per endpoint (blocked_until), the subject that holds an
endpoint alive (held_by), and when each subject was last seen holding each account

Revision ID: 0008hooks
Revises: 0008ui
Create Date: 2026-12-03
"""
from __future__ import annotations

import datetime

import sqlalchemy as sa
from alembic import op

revision = '0008hooks'
down_revision = '0008ui'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('webhook_endpoint', schema=None) as batch_op:
        batch_op.add_column(sa.Column('blocked_until', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('held_by', sa.String(length=255), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('suspended_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('events_from_at', sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE webhook_endpoint SET held_by = created_by, events_from_at = created_at")
    op.create_index('ix_webhook_delivery_endpoint_due', 'webhook_delivery',
                    ['endpoint_id', 'status', 'next_attempt_at'], unique=False)
    op.create_table(
        'membership_seen',
        sa.Column('subject', sa.String(length=255), nullable=False),
        sa.Column('account', sa.String(length=63), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('subject', 'account', name=op.f('pk_membership_seen')),
    )
    # Existing endpoints' creators count as seen now (and as having been seen at all), so an
    # upgrade gives them the full period instead of suspending every endpoint at once.
    now = datetime.datetime.now(datetime.UTC)
    seen = sa.table('membership_seen', sa.column('subject', sa.String), sa.column('account', sa.String),
                    sa.column('last_seen_at', sa.DateTime(timezone=True)))
    rows = op.get_bind().execute(sa.text(
        "SELECT DISTINCT created_by, account_name FROM webhook_endpoint")).all()
    keys = {(subject, account or '*') for subject, account in rows} | {(subject, '') for subject, _ in rows}
    if keys:
        op.bulk_insert(seen, [{'subject': s, 'account': a, 'last_seen_at': now} for s, a in sorted(keys)])


def downgrade() -> None:
    op.drop_table('membership_seen')
    op.drop_index('ix_webhook_delivery_endpoint_due', table_name='webhook_delivery')
    with op.batch_alter_table('webhook_endpoint', schema=None) as batch_op:
        batch_op.drop_column('events_from_at')
        batch_op.drop_column('suspended_at')
        batch_op.drop_column('held_by')
        batch_op.drop_column('blocked_until')
