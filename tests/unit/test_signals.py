"""Signals on SQLite (gateway/kit/signals.py): handed to this process's listeners of the same
database after the commit, dropped on rollback; every callback is called once with None when a
listener starts ("re-read everything"). Postgres (LISTEN/NOTIFY between processes, reconnects)
is tested with two gateways in tests/pools/test_replicas.py."""

from __future__ import annotations

import queue

import pytest
from sqlalchemy import text

from gateway.kit.db import make_engine, make_sessionmaker, transaction
from gateway.kit.signals import POOL, RESERVATIONS, Listener, _decode, _encode, notify


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path}/signals.db"
    engine = make_engine(url)
    yield url, make_sessionmaker(engine)
    engine.dispose()


def recorder(listener: Listener, *topics: str) -> queue.Queue:
    got: queue.Queue = queue.Queue()
    for topic in topics:
        listener.on(topic, lambda name, topic=topic: got.put((topic, name)))
    return got


def take(got: queue.Queue, n: int) -> list:
    return [got.get(timeout=5) for _ in range(n)]


def test_a_committed_signal_reaches_every_listener_of_the_database_once_and_a_rolled_back_one_none(db, tmp_path):
    url, sessions = db
    a, b = Listener(url), Listener(url)
    elsewhere = Listener(f"sqlite:///{tmp_path}/other.db")
    got_a, got_b = recorder(a, POOL, RESERVATIONS), recorder(b, POOL)
    got_elsewhere = recorder(elsewhere, POOL)
    for listener in (a, b, elsewhere):
        listener.start()
    try:
        # Started: every callback once with None (re-read everything).
        assert sorted(take(got_a, 2)) == [(POOL, None), (RESERVATIONS, None)]
        assert take(got_b, 1) == [(POOL, None)] and take(got_elsewhere, 1) == [(POOL, None)]

        with pytest.raises(RuntimeError), transaction(sessions) as s:
            notify(s, POOL, "rolled-back")
            raise RuntimeError("the change failed")
        with transaction(sessions) as s:
            s.execute(text("SELECT 1"))
            notify(s, POOL, "slurm-a")
            assert got_a.empty()  # not before the commit
        with transaction(sessions) as s:  # a transaction that only signals
            notify(s, RESERVATIONS, "kube-b")

        assert take(got_a, 2) == [(POOL, "slurm-a"), (RESERVATIONS, "kube-b")]
        assert take(got_b, 1) == [(POOL, "slurm-a")]  # b listens to "pool" only
        with transaction(sessions) as s:  # the rolled-back one never comes after a later commit either
            notify(s, POOL, "last")
        assert take(got_a, 1) == [(POOL, "last")] and take(got_b, 1) == [(POOL, "last")]
        assert got_a.empty() and got_b.empty() and got_elsewhere.empty()  # another database: nothing
    finally:
        for listener in (a, b, elsewhere):
            listener.stop()
    with transaction(sessions) as s:  # stopped: nobody is told, nothing fails
        notify(s, POOL, "after-stop")
    assert got_a.empty()


def test_a_failing_callback_does_not_stop_the_others(db):
    url, sessions = db
    listener = Listener(url)

    def broken(name):
        raise ValueError("a handler's bug")

    listener.on(POOL, broken)
    got = recorder(listener, POOL)
    listener.start()
    try:
        assert take(got, 1) == [(POOL, None)]
        with transaction(sessions) as s:
            notify(s, POOL, "slurm-a")
        assert take(got, 1) == [(POOL, "slurm-a")]
    finally:
        listener.stop()


def test_the_payload_is_a_topic_and_a_name_and_anything_else_means_re_read_everything():
    assert _decode(_encode(POOL, "slurm-a")) == (POOL, "slurm-a")
    assert len(_encode(POOL, "p" * 63)) < 8000  # Postgres' limit for a payload
    for junk in ("", "not json", "[]", '{"name": "x"}', '{"topic": 1}', '{"topic": "pool", "name": 2}'):
        assert _decode(junk) == (None, None), junk
