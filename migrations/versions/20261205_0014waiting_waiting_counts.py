"""Waiting jobs counted as they change, not per request (issue #32, docs/jobs.md "Caps").

``waiting_count`` holds, per account and POSIX user, how many jobs are waiting to start
(blocked, pending, dispatching, queued, requeued: ``gateway.jobs.service.WAITING_STATES``).
Database triggers on ``job`` keep it, in the same transaction as the row that changes, so
every writer (a submission, an array of 10,000 tasks, the dispatcher's round, a cancel, a
reconcile, SQL typed by an operator) keeps it exact and no writer has to remember it. The
submission's cap check reads it instead of counting job rows, so its cost no longer grows
with the work that waits or with history.

Postgres: inserts are counted per statement (one upsert per account and user of an array's
tasks); updates and deletes per row, filtered by the trigger's WHEN clause, so a row that
stays waiting (or stays not waiting) under the same account and user costs nothing.
SQLite: per row (it serialises writers; an array's tasks cost a few microseconds each).

The list of waiting states is written here; changing WAITING_STATES needs a migration that
rewrites these triggers (tests/jobs/test_waiting_counts.py compares the counters with a
COUNT after every transition).

Revision ID: 0014waiting
Revises: 0013reclaim
Create Date: 2026-12-05
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014waiting'
down_revision = '0013reclaim'
branch_labels = None
depends_on = None

WAITING = "('blocked', 'pending', 'dispatching', 'queued', 'requeued')"

_PG = [
    f"""
CREATE FUNCTION isthmus_waiting_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO waiting_count AS w (account_name, username, n)
    SELECT account_name, username, count(*) FROM isthmus_new_jobs
     WHERE state IN {WAITING} GROUP BY account_name, username ORDER BY account_name, username
  ON CONFLICT (account_name, username) DO UPDATE SET n = w.n + EXCLUDED.n;
  RETURN NULL;
END $$""",
    f"""
CREATE FUNCTION isthmus_waiting_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP <> 'INSERT' AND OLD.state IN {WAITING} THEN
    UPDATE waiting_count SET n = n - 1 WHERE account_name = OLD.account_name AND username = OLD.username;
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.state IN {WAITING} THEN
    INSERT INTO waiting_count AS w (account_name, username, n) VALUES (NEW.account_name, NEW.username, 1)
    ON CONFLICT (account_name, username) DO UPDATE SET n = w.n + 1;
  END IF;
  RETURN NULL;
END $$""",
    """
CREATE TRIGGER job_waiting_inserted AFTER INSERT ON job REFERENCING NEW TABLE AS isthmus_new_jobs
FOR EACH STATEMENT EXECUTE FUNCTION isthmus_waiting_inserted()""",
    f"""
CREATE TRIGGER job_waiting_updated AFTER UPDATE OF state, account_name, username ON job FOR EACH ROW
WHEN ((OLD.state IN {WAITING}) <> (NEW.state IN {WAITING})
      OR (OLD.state IN {WAITING} AND (OLD.account_name <> NEW.account_name OR OLD.username <> NEW.username)))
EXECUTE FUNCTION isthmus_waiting_changed()""",
    f"""
CREATE TRIGGER job_waiting_deleted AFTER DELETE ON job FOR EACH ROW WHEN (OLD.state IN {WAITING})
EXECUTE FUNCTION isthmus_waiting_changed()""",
]

_UP = ("INSERT OR IGNORE INTO waiting_count (account_name, username, n) VALUES ({r}.account_name, {r}.username, 0); "
       "UPDATE waiting_count SET n = n + 1 WHERE account_name = {r}.account_name AND username = {r}.username;")
_DOWN = "UPDATE waiting_count SET n = n - 1 WHERE account_name = {r}.account_name AND username = {r}.username;"
_SQLITE = [
    f"""CREATE TRIGGER job_waiting_inserted AFTER INSERT ON job FOR EACH ROW WHEN NEW.state IN {WAITING}
BEGIN {_UP.format(r='NEW')} END""",
    f"""CREATE TRIGGER job_waiting_updated AFTER UPDATE OF state, account_name, username ON job FOR EACH ROW
WHEN (OLD.state IN {WAITING}) <> (NEW.state IN {WAITING})
     OR (OLD.state IN {WAITING} AND (OLD.account_name <> NEW.account_name OR OLD.username <> NEW.username))
BEGIN
  UPDATE waiting_count SET n = n - 1
   WHERE OLD.state IN {WAITING} AND account_name = OLD.account_name AND username = OLD.username;
  INSERT OR IGNORE INTO waiting_count (account_name, username, n)
   SELECT NEW.account_name, NEW.username, 0 WHERE NEW.state IN {WAITING};
  UPDATE waiting_count SET n = n + 1
   WHERE NEW.state IN {WAITING} AND account_name = NEW.account_name AND username = NEW.username;
END""",
    f"""CREATE TRIGGER job_waiting_deleted AFTER DELETE ON job FOR EACH ROW WHEN OLD.state IN {WAITING}
BEGIN {_DOWN.format(r='OLD')} END""",
]


def upgrade() -> None:
    op.create_table(
        'waiting_count',
        sa.Column('account_name', sa.String(63), primary_key=True),
        sa.Column('username', sa.String(32), primary_key=True),
        sa.Column('n', sa.Integer(), nullable=False, server_default='0'),
    )
    op.create_index('ix_waiting_count_username', 'waiting_count', ['username'])
    if op.get_bind().dialect.name == 'postgresql':  # no job changes between the count and the triggers
        op.execute("LOCK TABLE job IN SHARE ROW EXCLUSIVE MODE")
    # Today's waiting jobs, counted once (the history is not read again).
    op.execute(f"INSERT INTO waiting_count (account_name, username, n) SELECT account_name, username, count(*) "
               f"FROM job WHERE state IN {WAITING} GROUP BY account_name, username")
    for statement in (_PG if op.get_bind().dialect.name == 'postgresql' else _SQLITE):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        for trigger in ('job_waiting_inserted', 'job_waiting_updated', 'job_waiting_deleted'):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON job")
        op.execute("DROP FUNCTION IF EXISTS isthmus_waiting_inserted()")
        op.execute("DROP FUNCTION IF EXISTS isthmus_waiting_changed()")
    else:
        for trigger in ('job_waiting_inserted', 'job_waiting_updated', 'job_waiting_deleted'):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.drop_index('ix_waiting_count_username', table_name='waiting_count')
    op.drop_table('waiting_count')
