"""The delivery thread: fan out the outbox, claim due deliveries fairly, send, record each outcome.

Runs in ``isthmus worker`` (and in ``isthmus serve`` with ``ISTHMUS_WEBHOOKS_IN_SERVE``);
any number may run at once (docs/webhooks.md).

Each endpoint has at most one attempt in flight (its claim leases the endpoint), each
attempt has a hard deadline, and each outcome is recorded as soon as it is known, so a
slow or dead receiver holds only its own slot: the loop claims again whenever a slot
frees, and an account holds at most ``webhook_account_concurrency`` slots.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gateway.kit.db import transaction
from gateway.kit.settings import WebhookSettings
from gateway.webhooks import service
from gateway.webhooks.address import Allowlist, Refused, resolve
from gateway.webhooks.send import Sender, SendError, sign, tls_context

log = logging.getLogger("isthmus.webhooks")


class WebhookWorker:
    def __init__(self, *, sessions: sessionmaker[Session], settings: WebhookSettings):
        self.sessions = sessions
        self.settings = settings
        self.allow = Allowlist.parse(settings.webhook_allowlist)
        self.tls = tls_context(settings.webhook_ca_file or None)
        self.postgres = not settings.is_sqlite
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(settings.webhook_concurrency,
                                                           thread_name_prefix="webhook-send")
        self._lock = threading.Lock()
        self._in_flight: collections.Counter[str | None] = collections.Counter()  # per account
        self._slot_freed = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._slot_freed.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.webhook_timeout_s + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run_forever(self) -> None:
        interval = self.settings.webhook_interval_s
        fanned_out_at = 0.0
        while not self._stop.is_set():
            self._slot_freed.clear()
            try:
                if time.monotonic() - fanned_out_at >= interval:
                    fanned_out_at = time.monotonic()
                    self._fan_out()
                self._dispatch()
            except Exception:
                log.exception("webhook round failed")
            # Claim again as soon as an attempt finishes (a slot is free), else each interval.
            self._slot_freed.wait(interval)

    def run_once(self) -> bool:
        """One round, waiting for what it sent (tests, benchmarks); True if it claimed anything."""
        self._fan_out()
        futures = self._dispatch()
        concurrent.futures.wait(futures)
        return bool(futures)

    def _fan_out(self) -> None:
        try:
            with transaction(self.sessions) as session:
                service.fan_out(session, settle_s=self.settings.webhook_settle_s,
                                unseen_s=self.settings.webhook_holder_unseen_s)
                service.fan_out_nodes(session)
        except (IntegrityError, DBAPIError) as exc:  # another worker won a race; next round
            log.info("webhook fan-out skipped this round: %s", type(exc).__name__)

    def _dispatch(self) -> list[concurrent.futures.Future]:
        s = self.settings
        with self._lock:
            free = s.webhook_concurrency - sum(self._in_flight.values())
            busy = dict(self._in_flight)
        if free <= 0:
            return []
        with transaction(self.sessions) as session:
            claimed = service.claim(session, slots=free, busy=busy, account_slots=s.webhook_account_concurrency,
                                    lease_s=s.webhook_lease_s, postgres=self.postgres)
        futures = []
        for c in claimed:
            with self._lock:
                self._in_flight[c.account] += 1
            futures.append(self._pool.submit(self._run_endpoint, c))
        return futures

    def _run_endpoint(self, c: service.Claimed | None) -> None:
        """Send an endpoint's due deliveries one after another (up to ``webhook_batch``),
        recording each outcome before the next is sent; stop at the first failure."""
        s = self.settings
        account = c.account if c else None
        sent = 0
        sender = Sender(self.tls)  # one connection for the burst
        try:
            while c is not None:
                ok, status, error = self._deliver(c, sender)
                sent += 1
                more = sent < s.webhook_batch and not self._stop.is_set()
                try:
                    with transaction(self.sessions) as session:
                        c = service.record(session, claimed=c, ok=ok, status_code=status, error=error,
                                           base_s=s.webhook_backoff_base_s, max_s=s.webhook_backoff_max_s,
                                           disable_after=s.webhook_disable_after_failures,
                                           lease_s=s.webhook_lease_s, more=more)
                except Exception:
                    log.exception("could not record webhook delivery %s", c.delivery_id)
                    c = None
        except Exception:
            log.exception("webhook delivery to endpoint %s failed unexpectedly", c.endpoint_id if c else "?")
        finally:
            sender.close()
            with self._lock:
                self._in_flight[account] -= 1
                if self._in_flight[account] <= 0:
                    del self._in_flight[account]
            self._slot_freed.set()

    def _deliver(self, c: service.Claimed, sender: Sender) -> tuple[bool, int | None, str]:
        s = self.settings
        ok, status, error = False, None, ""
        try:
            target = resolve(c.url, self.allow)  # again at delivery: DNS may have changed
            ts = int(time.time())
            headers = {"webhook-id": c.msg_id, "webhook-timestamp": str(ts),
                       "webhook-signature": sign(c.secret, c.msg_id, ts, c.payload)}
            status = sender.post(target, headers, c.payload, timeout_s=s.webhook_timeout_s)
            ok = True
        except Refused as exc:
            error = f"refused: {exc}"
        except SendError as exc:
            status, error = exc.status, str(exc)
        # The endpoint id only: a URL may carry a token in its query.
        log.info("webhook delivery %s to endpoint %s attempt %s: %s", c.msg_id, c.endpoint_id, c.attempt,
                 "delivered" if ok else error)
        return ok, status, error
