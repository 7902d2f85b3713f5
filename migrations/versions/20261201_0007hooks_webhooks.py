"""Webhooks: endpoints, the outbox cursor over job_event, and deliveries

Revision ID: 0007hooks
Revises: 0007flows
Create Date: 2026-12-01
"""
from __future__ import annotations

import datetime

import sqlalchemy as sa
from alembic import op

revision = '0007hooks'
down_revision = '0007flows'
branch_labels = None
depends_on = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        'webhook_endpoint',
        sa.Column('id', BigIntPK, autoincrement=True, nullable=False),
        sa.Column('account_name', sa.String(length=63), nullable=True),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('description', sa.Text(), nullable=False),
        sa.Column('secret', sa.String(length=128), nullable=False),
        sa.Column('created_by', sa.String(length=255), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('enabled', sa.Boolean(), nullable=False),
        sa.Column('consecutive_failures', sa.Integer(), nullable=False),
        sa.Column('last_error', sa.Text(), nullable=False),
        sa.Column('last_error_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_success_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('disabled_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('disabled_reason', sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(['account_name'], ['account.name'],
                                name=op.f('fk_webhook_endpoint_account_name_account'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_endpoint')),
    )
    op.create_index('ix_webhook_endpoint_account', 'webhook_endpoint', ['account_name', 'id'], unique=False)
    cursor = op.create_table(
        'webhook_cursor',
        sa.Column('name', sa.String(length=32), nullable=False),
        sa.Column('last_event_id', sa.BigInteger(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_webhook_cursor')),
    )
    op.create_table(
        'webhook_delivery',
        sa.Column('id', BigIntPK, autoincrement=True, nullable=False),
        sa.Column('endpoint_id', sa.BigInteger(), nullable=False),
        sa.Column('event_id', sa.BigInteger(), nullable=False),
        sa.Column('msg_id', sa.String(length=64), nullable=False),
        sa.Column('event_type', sa.String(length=64), nullable=False),
        sa.Column('job_id', sa.String(length=36), nullable=False),
        sa.Column('payload', sa.Text(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_status_code', sa.Integer(), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=False),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['endpoint_id'], ['webhook_endpoint.id'],
                                name=op.f('fk_webhook_delivery_endpoint_id_webhook_endpoint'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_delivery')),
        sa.UniqueConstraint('endpoint_id', 'event_id', name='uq_webhook_delivery_endpoint_id'),
    )
    op.create_index('ix_webhook_delivery_due', 'webhook_delivery', ['status', 'next_attempt_at'], unique=False)
    op.create_index('ix_webhook_delivery_endpoint', 'webhook_delivery', ['endpoint_id', 'id'], unique=False)
    # The outbox starts after the events that exist now: history is not replayed to new endpoints.
    last = op.get_bind().execute(sa.text("SELECT COALESCE(MAX(id), 0) FROM job_event")).scalar()
    op.bulk_insert(cursor, [{"name": "job_event", "last_event_id": int(last or 0),
                             "updated_at": datetime.datetime.now(datetime.UTC)}])


def downgrade() -> None:
    op.drop_index('ix_webhook_delivery_endpoint', table_name='webhook_delivery')
    op.drop_index('ix_webhook_delivery_due', table_name='webhook_delivery')
    op.drop_table('webhook_delivery')
    op.drop_table('webhook_cursor')
    op.drop_index('ix_webhook_endpoint_account', table_name='webhook_endpoint')
    op.drop_table('webhook_endpoint')
