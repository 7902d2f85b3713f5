"""A job set's spec stored once: the template its tasks are rendered from (issue #27 finding 3)

A task written from now on keeps only its own values in job.spec (``{}`` for an array's,
``{"parameters": {...}}`` for a sweep's); its full spec is its set's, rendered
(gateway/jobs/specs.py). Tasks written before keep their full spec in job.spec, which
is read as it is: nothing to move on upgrade.

Revision ID: 0008sets
Revises: 0008width
Create Date: 2026-12-03
"""
from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = '0008sets'
down_revision = '0008width'
branch_labels = None
depends_on = None

# A frozen copy of the rendering in gateway/jobs/specs.py as of this revision (a migration
# does not import the application, whose code moves on).
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]{0,62})\s*\}\}")


def _render(template: dict, own: dict, index: int, count: int) -> dict:
    values = {**(own.get("parameters") or {}), "index": str(index)}

    def sub(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text) if "{{" in text else text

    env = {k: sub(v) for k, v in (template.get("env") or {}).items()}
    env["ISTHMUS_ARRAY_INDEX"], env["ISTHMUS_ARRAY_COUNT"] = str(index), str(count)
    spec = {**template, "command": [sub(a) for a in template["command"]], "env": env}
    if "parameters" in own:
        spec["parameters"] = own["parameters"]
    return spec


def upgrade() -> None:
    with op.batch_alter_table('job_set', schema=None) as batch_op:
        batch_op.add_column(sa.Column('spec', sa.JSON(), nullable=True))


def downgrade() -> None:
    # Tasks written since upgrade() hold only their values: give each its full spec back
    # before the template it is rendered from goes.
    bind = op.get_bind()
    job = sa.table('job', sa.column('id'), sa.column('spec', sa.JSON()), sa.column('job_set_id'),
                   sa.column('array_index'))
    job_set = sa.table('job_set', sa.column('id'), sa.column('spec', sa.JSON()), sa.column('task_count'))
    sets = {r.id: (r.spec, r.task_count) for r in bind.execute(
        sa.select(job_set.c.id, job_set.c.spec, job_set.c.task_count).where(job_set.c.spec.is_not(None)))}
    if sets:
        for r in bind.execute(sa.select(job.c.id, job.c.spec, job.c.job_set_id, job.c.array_index)
                              .where(job.c.job_set_id.in_(list(sets)))).all():
            own = r.spec or {}
            if "command" not in own:
                template, count = sets[r.job_set_id]
                bind.execute(job.update().where(job.c.id == r.id)
                             .values(spec=_render(template, own, r.array_index, count)))
    # A plain ALTER (SQLite has DROP COLUMN since 3.35): a batch copy of job_set would drop
    # the table its tasks' foreign keys point at, which SQLite refuses once there are tasks.
    op.drop_column('job_set', 'spec')
