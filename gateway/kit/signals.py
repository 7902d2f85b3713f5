"""Signals between processes through the database (issue #47, item 2).

A change that other processes act on (an admin drains a pool, makes or deletes an advance
reservation) is written to the database and *signalled* through it, never read from another
process's memory:

- ``notify(session, topic, name)`` inside the writer's transaction. On Postgres it is
  ``SELECT pg_notify('isthmus', ...)``: delivered to every listening connection when the
  transaction commits, dropped when it rolls back. The payload is the topic and a name (a pool's),
  never a secret.
- ``Listener``: a daemon thread with its own psycopg connection (``LISTEN isthmus``) that calls
  the callbacks registered for a topic with the name. Notifications sent while it is not
  connected are lost, so after every connect (the first one and each one after a database
  restart or a dropped connection, retried with backoff) it calls every callback once with
  ``None``: "re-read everything". The periodic re-reads stay as the fallback for anything lost
  between (``capacity_ttl_s``; the dispatcher's native-reservation sync every 15 s).

SQLite (the embedded default, one process by design): ``notify`` hands the signal, after the
commit, to the listeners of the same database in this process (dropped on rollback, as on
Postgres); another process on the same file (``serve --workers N``, a separate worker) is not
told and relies on the periodic re-reads.

The connection URL is never logged: only what went wrong, by its type and the driver's words.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import threading
from collections.abc import Callable

from sqlalchemy import event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

log = logging.getLogger("isthmus.signals")

CHANNEL = "isthmus"
POOL = "pool"  # a pool's state or weight, or its maintenance windows, changed: payload its name
RESERVATIONS = "reservations"  # an advance reservation on a pool was made or deleted: payload the pool

Callback = Callable[[str | None], None]

_PENDING = "isthmus.signals"  # session.info key: SQLite signals waiting for the commit


def notify(session: Session, topic: str, name: str) -> None:
    """Signal ``topic`` about ``name`` (a pool) to every listener of this database when the
    session's transaction commits; nothing is sent if it rolls back."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        session.execute(text("SELECT pg_notify(:channel, :message)"),
                        {"channel": CHANNEL, "message": _encode(topic, name)})
        return
    pending = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = []
        event.listen(session, "after_commit", _deliver_pending)
        event.listen(session, "after_soft_rollback", _drop_pending)
    pending.append((_key(bind.url), topic, name))


def _encode(topic: str, name: str | None) -> str:
    return json.dumps({"topic": topic, "name": name}, separators=(",", ":"))


def _decode(message: str) -> tuple[str | None, str | None]:
    """(topic, name); (None, None) for a message this version cannot read: re-read everything."""
    try:
        doc = json.loads(message)
        topic, name = doc["topic"], doc.get("name")
    except (ValueError, TypeError, KeyError):
        return None, None
    if not isinstance(topic, str) or not (name is None or isinstance(name, str)):
        return None, None
    return topic, name


# ------------------------------------------------------------------ SQLite: in this process

_LOCAL: dict[str, set[Listener]] = {}
_LOCAL_LOCK = threading.Lock()


def _key(url: str | URL) -> str:
    """The database a URL names, as the in-process listeners are keyed (no password)."""
    return make_url(url).render_as_string(hide_password=True)


def _deliver_pending(session: Session) -> None:
    pending = session.info.get(_PENDING) or []
    items, pending[:] = list(pending), []
    for key, topic, name in items:
        with _LOCAL_LOCK:
            listeners = list(_LOCAL.get(key, ()))
        for listener in listeners:
            listener._queue.put((topic, name))


def _drop_pending(session: Session, previous_transaction) -> None:
    if previous_transaction.parent is None:  # the whole transaction (a savepoint's keeps them)
        pending = session.info.get(_PENDING)
        if pending:
            pending.clear()


# ------------------------------------------------------------------ the listener

class Listener:
    """Calls ``on(topic, callback)``'s callbacks with each signalled name, in its own thread;
    after every (re)connect, every callback once with None. ``start`` / ``stop``."""

    BACKOFF_S = (0.5, 30.0)  # first retry after a failed connect or a lost connection, and the most
    PING_S = 30.0  # a connection silent this long is asked SELECT 1 (a dead one fails it)
    CONNECT_TIMEOUT_S = 5

    def __init__(self, url: str, *, name: str = "isthmus-signals") -> None:
        self._url = make_url(url)  # never logged
        self.local = self._url.get_backend_name() != "postgresql"
        self.name = name
        self._callbacks: dict[str, list[Callback]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue = queue.Queue()  # SQLite: (topic, name) from this process's commits
        self._wake_r, self._wake_w = -1, -1
        self.connected = threading.Event()  # listening now (SQLite: from start to stop)
        self.connects = 0  # how many times it connected (and re-read everything)
        self.backend_pid: int | None = None  # the listening connection's server process (Postgres)

    def on(self, topic: str, callback: Callback) -> Listener:
        self._callbacks.setdefault(topic, []).append(callback)
        return self

    def start(self) -> Listener:
        if self.local:
            with _LOCAL_LOCK:
                _LOCAL.setdefault(_key(self._url), set()).add(self)
            target = self._run_local
        else:
            self._wake_r, self._wake_w = os.pipe()
            target = self._run_postgres
        self._thread = threading.Thread(target=target, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self.local:
            with _LOCAL_LOCK:
                mine = _LOCAL.get(_key(self._url), set())
                mine.discard(self)
                if not mine:
                    _LOCAL.pop(_key(self._url), None)
            self._queue.put(None)
        elif self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._wake_r >= 0 and (self._thread is None or not self._thread.is_alive()):
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    # --- delivery ----------------------------------------------------------------------

    def _deliver(self, topic: str | None, name: str | None) -> None:
        """Topic None: every callback with None (re-read everything)."""
        if topic is None:
            targets = [(t, cb) for t, cbs in self._callbacks.items() for cb in cbs]
            name = None
        else:
            targets = [(topic, cb) for cb in self._callbacks.get(topic, ())]
        for t, callback in targets:
            try:
                callback(name)
            except Exception:  # one failing handler must not stop the signals
                log.exception("signals: the %s handler failed (the periodic re-read still runs)", t)

    def _reread(self) -> None:
        self.connects += 1
        self.connected.set()
        self._deliver(None, None)

    def _run_local(self) -> None:
        self._reread()
        while True:
            item = self._queue.get()
            if item is None or self._stop.is_set():
                break
            self._deliver(*item)
        self.connected.clear()

    # --- Postgres ----------------------------------------------------------------------

    def _connect(self):
        import psycopg

        args = {k: v for k, v in self._url.translate_connect_args(username="user", database="dbname").items()
                if v is not None}
        args.update({k: v if isinstance(v, str) else v[-1] for k, v in self._url.query.items()})
        defaults = {"connect_timeout": self.CONNECT_TIMEOUT_S, "application_name": "isthmus-signals",
                    "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
        return psycopg.connect(**{**defaults, **args}, autocommit=True)

    def _run_postgres(self) -> None:
        delay = self.BACKOFF_S[0]
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:  # noqa: BLE001 - refused, timed out, bad credentials: try again
                log.warning("signals: cannot listen to the database (%s); next try in %.1f s; meanwhile "
                            "changes made by other processes are seen at the periodic re-read", _why(exc), delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self.BACKOFF_S[1])
                continue
            try:
                self._listen(conn)  # returns when stopped
            except Exception as exc:  # noqa: BLE001 - terminated, restarted, network: connect again
                if not self._stop.is_set():
                    log.warning("signals: lost the listening connection (%s); reconnecting in %.1f s",
                                _why(exc), self.BACKOFF_S[0])
            finally:
                self.connected.clear()
                self.backend_pid = None
                try:
                    conn.close()
                except Exception:  # noqa: BLE001, S110 - it is gone already
                    pass
            delay = self.BACKOFF_S[0]
            self._stop.wait(delay)

    def _listen(self, conn) -> None:
        conn.execute(f"LISTEN {CHANNEL}")
        self.backend_pid = conn.info.backend_pid
        if self.connects:
            log.info("signals: listening again; re-reading what may have changed meanwhile")
        self._reread()  # after LISTEN: nothing falls between the re-read and the first signal
        poller = select.poll()  # not select(): a busy process may hold descriptors past 1024
        poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            ready = {fd for fd, _ in poller.poll(self.PING_S * 1000)}
            if self._wake_r in ready:
                os.read(self._wake_r, 64)
                continue
            if not ready:
                conn.execute("SELECT 1")  # a connection that died silently fails here
                continue
            for n in conn.notifies(timeout=0):  # what arrived; raises when the server closed it
                if n.channel == CHANNEL:
                    self._deliver(*_decode(n.payload))


def _why(exc: BaseException) -> str:
    words = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {words[0]}" if words else type(exc).__name__
