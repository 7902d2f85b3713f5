"""No overspend under concurrent dispatchers: 64 threads (and 2 OS processes) on Postgres."""

from __future__ import annotations

import subprocess
import sys
import threading

from sqlalchemy import func, select

from gateway.audit.service import Who
from gateway.kit.db import make_engine, make_sessionmaker, transaction
from gateway.kit.errors import QuotaExceeded
from gateway.ledger import chains as ledger_chains
from gateway.ledger import reading as ledger_reading
from gateway.ledger import service as ledger
from gateway.models.ledger import LedgerEntry, Reservation
from tests.ledger.dbfixtures import add_account, add_job


def _setup(factory, n_jobs: int) -> list[str]:
    with transaction(factory) as s:
        add_account(s, "org", max_gpus=1000)
        add_account(s, "team", parent="org", max_gpus=80)  # room for exactly 10 gangs of 8
        return [add_job(s, "team", gpus=8, username=f"u{i % 7}").id for i in range(n_jobs)]


def _reserve_all(factory, job_ids, barrier=None) -> tuple[int, int, list[BaseException]]:
    from gateway.models.jobs import Job

    ok = refused = 0
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(job_id: str) -> None:
        nonlocal ok, refused
        if barrier is not None:
            barrier.wait()
        try:
            for _attempt in range(50):
                try:
                    with transaction(factory) as s:
                        job = s.get(Job, job_id)
                        ledger.reserve(s, job=job, pool="slurm", actor="test:thread")
                    break
                except ledger_chains.ChainChanged:  # an admin re-parented the chain: retry, as callers must
                    continue
            else:
                raise AssertionError("reservation kept failing with ChainChanged")
            with lock:
                ok += 1
        except QuotaExceeded:
            with lock:
                refused += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(j,)) for j in job_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return ok, refused, errors


def test_64_concurrent_reservations_admit_exactly_10(pg_url):
    engine = make_engine(pg_url, pool_size=64)
    factory = make_sessionmaker(engine)
    try:
        ids = _setup(factory, 64)
        ok, refused, errors = _reserve_all(factory, ids, threading.Barrier(64))
        assert errors == []
        assert (ok, refused) == (10, 54)
        with transaction(factory) as s:
            assert s.scalar(select(func.count()).select_from(LedgerEntry).where(LedgerEntry.kind == "reserve")) == 10
            assert s.scalar(select(func.count()).select_from(Reservation)) == 10
            assert ledger_reading.get_balance(s, "team").reserved_gpus == 80
            assert ledger_reading.get_balance(s, "org").reserved_gpus == 80
            assert ledger_reading.verify(s) == []
    finally:
        engine.dispose()


def test_concurrent_sqlite_writers_also_admit_exactly_10(tmp_path, sqlite_template):
    import shutil

    path = tmp_path / "c.db"
    shutil.copy(sqlite_template, path)
    engine = make_engine(f"sqlite:///{path}")
    factory = make_sessionmaker(engine)
    try:
        ids = _setup(factory, 32)
        ok, refused, errors = _reserve_all(factory, ids, threading.Barrier(32))
        assert errors == [] and (ok, refused) == (10, 22)
        with transaction(factory) as s:
            assert ledger_reading.verify(s) == []
    finally:
        engine.dispose()


WORKER = """
import sys
from gateway.kit.db import make_engine, make_sessionmaker, transaction
from gateway.kit.errors import QuotaExceeded
from gateway.models.jobs import Job
from gateway.ledger import service as ledger
from gateway.ledger import chains as ledger_chains
from gateway.ledger import reading as ledger_reading
url, ids = sys.argv[1], sys.argv[2].split(",")
f = make_sessionmaker(make_engine(url))
ok = 0
for job_id in ids:
    try:
        with transaction(f) as s:
            ledger.reserve(s, job=s.get(Job, job_id), pool="slurm", actor="test:process")
        ok += 1
    except QuotaExceeded:
        pass
print(ok)
"""


def test_two_processes_share_one_quota(pg_url):
    engine = make_engine(pg_url)
    factory = make_sessionmaker(engine)
    try:
        ids = _setup(factory, 40)
        halves = [",".join(ids[0::2]), ",".join(ids[1::2])]
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, pg_url, h], stdout=subprocess.PIPE, text=True)
                 for h in halves]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs)
        assert sum(int(o.strip()) for o in outs) == 10
        with transaction(factory) as s:
            assert ledger_reading.get_balance(s, "team").reserved_gpus == 80
            assert ledger_reading.verify(s) == []
    finally:
        engine.dispose()


def test_reparenting_while_reserving_keeps_every_subtree_total_right(pg_url):
    """Reservations race an admin moving their account between two organisations.

    A reservation that waited for the move's locks must charge the NEW ancestors: every
    account's running totals must still equal the sum of its subtree's entries, and no
    reservation may fail with a deadlock or lose its entry.
    """
    from gateway.admin import lifecycle as accounts
    from gateway.models.accounts import Account

    engine = make_engine(pg_url, pool_size=12)
    factory = make_sessionmaker(engine)
    try:
        with transaction(factory) as s:
            add_account(s, "org-a", max_gpus=10_000)
            add_account(s, "org-b", max_gpus=10_000)
            add_account(s, "mid", parent="org-a")
            add_account(s, "team", parent="mid")
            ids = [add_job(s, "team", gpus=1).id for _ in range(240)]
        stop = threading.Event()
        moves: list[str] = []
        move_errors: list[BaseException] = []

        def mover() -> None:
            target = "org-b"
            while not stop.is_set():
                try:
                    with transaction(factory) as s:
                        accounts.update(s, name="mid", changes={"parent": target}, by=Who("test:admin"))
                    moves.append(target)
                    target = "org-a" if target == "org-b" else "org-b"
                except BaseException as exc:  # noqa: BLE001
                    move_errors.append(exc)
                    return

        m = threading.Thread(target=mover)
        m.start()
        try:
            chunks = [ids[i::8] for i in range(8)]
            results = [None] * 8

            def run(i: int) -> None:
                results[i] = _reserve_all(factory, chunks[i])

            ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(180)
        finally:
            stop.set()
            m.join(30)
        errors = [e for r in results for e in r[2]] + move_errors
        assert errors == []
        assert sum(r[0] for r in results) == 240
        assert len(moves) >= 3, "the mover must have moved the subtree while reservations ran"
        with transaction(factory) as s:
            assert ledger_reading.verify(s) == []
            parent = s.get(Account, "mid").parent_name
            other = "org-b" if parent == "org-a" else "org-a"
            assert ledger_reading.get_balance(s, parent).reserved_gpus == 240
            assert ledger_reading.get_balance(s, other).reserved_gpus == 0
    finally:
        engine.dispose()
