"""A job list filtered by state, newest first, served by an index (issue #32).

`GET /v1/jobs?state=failed` (and the dashboard's state filter) read
`WHERE account_name IN (...) AND state IN (...) ORDER BY id DESC LIMIT n`. With only
`ix_job_account_id (account_name, id)` Postgres walked the account's jobs newest first and
filtered them, so a state that is rare in the history (or absent) read the whole history.
`(account_name, state, id)` finds them directly.

`ix_job_user_state (username, state, account_name)` served only the per-user count at
submit, which now reads `waiting_count` (0014waiting): no query reads it, and every insert
paid for it. It is dropped.

Revision ID: 0015liststate
Revises: 0014waiting
Create Date: 2026-12-05
"""
from __future__ import annotations

from alembic import op

revision = '0015liststate'
down_revision = '0014waiting'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_job_account_state_id', 'job', ['account_name', 'state', 'id'])
    op.drop_index('ix_job_user_state', table_name='job')


def downgrade() -> None:
    op.create_index('ix_job_user_state', 'job', ['username', 'state', 'account_name'])
    op.drop_index('ix_job_account_state_id', table_name='job')
