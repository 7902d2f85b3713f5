"""job.estimated_pool as wide as a pool name (63), not 16

A pool name may have 63 characters (gateway/kit/names.py POOL_NAME_RE). With String(16), on
Postgres the first waiting job routed to a pool with a longer name (`slurm-a100-frankfurt-
production`) made every dispatch round fail with StringDataRightTruncation, so no job was
dispatched to any pool again (issue #28). SQLite does not enforce the width, but its schema
is kept equal to the models.

Revision ID: 0008width
Revises: 0007split
Create Date: 2026-12-03
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008width'
down_revision = '0007split'
branch_labels = None
depends_on = None


def _resize(old: int, new: int) -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column('job', 'estimated_pool', existing_type=sa.String(length=old), type_=sa.String(length=new),
                        existing_nullable=True)
        return
    # SQLite alters by rebuilding the table, which loses the DESC of ix_job_queue: make it again.
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.alter_column('estimated_pool', existing_type=sa.String(length=old), type_=sa.String(length=new),
                              existing_nullable=True)
    op.drop_index('ix_job_queue', table_name='job')
    op.create_index('ix_job_queue', 'job', ['state', 'account_name', sa.text('priority DESC'), 'id'])


def upgrade() -> None:
    _resize(16, 63)


def downgrade() -> None:
    # Names longer than 16 would not fit; the next dispatch round estimates again anyway.
    op.execute(sa.text("UPDATE job SET estimated_pool = NULL WHERE length(estimated_pool) > 16"))
    _resize(63, 16)
