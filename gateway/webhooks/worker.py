"""The delivery thread: fan out the outbox, claim due deliveries, send them, record the outcome.

Runs in ``isthmus worker`` (and in ``isthmus serve`` with ``ISTHMUS_WEBHOOKS_IN_SERVE``);
any number may run at once (docs/webhooks.md).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gateway.kit.db import transaction
from gateway.kit.settings import Settings
from gateway.webhooks import service
from gateway.webhooks.address import Allowlist, Refused, resolve
from gateway.webhooks.send import SendError, post, sign, tls_context

log = logging.getLogger("isthmus.webhooks")


class WebhookWorker:
    def __init__(self, *, sessions: sessionmaker[Session], settings: Settings):
        self.sessions = sessions
        self.settings = settings
        self.allow = Allowlist.parse(settings.webhook_allowlist)
        self.tls = tls_context(settings.webhook_ca_file or None)
        self.postgres = not settings.is_sqlite
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(settings.webhook_concurrency,
                                                           thread_name_prefix="webhook-send")

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.webhook_timeout_s + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.run_once()
            except Exception:  # noqa: BLE001 - the loop must survive a database hiccup
                log.exception("webhook round failed")
                busy = False
            if not busy:
                self._stop.wait(self.settings.webhook_interval_s)

    def run_once(self) -> bool:
        """One round; True when it claimed a full batch (more may be due right away)."""
        s = self.settings
        try:
            with transaction(self.sessions) as session:
                service.fan_out(session, settle_s=s.webhook_settle_s)
        except (IntegrityError, DBAPIError) as exc:  # another worker won a race; next round
            log.info("webhook fan-out skipped this round: %s", type(exc).__name__)
        with transaction(self.sessions) as session:
            claimed = service.claim(session, limit=s.webhook_batch, lease_s=s.webhook_lease_s,
                                    postgres=self.postgres)
        if claimed:
            outcomes = list(self._pool.map(self._deliver, claimed))
            self._record(outcomes)
        return len(claimed) >= s.webhook_batch

    def _deliver(self, c: service.Claimed) -> tuple[service.Claimed, bool, int | None, str]:
        s = self.settings
        ok, status, error = False, None, ""
        try:
            target = resolve(c.url, self.allow)  # again at delivery: DNS may have changed
            ts = int(time.time())
            headers = {"webhook-id": c.msg_id, "webhook-timestamp": str(ts),
                       "webhook-signature": sign(c.secret, c.msg_id, ts, c.payload)}
            status = post(target, headers, c.payload, timeout_s=s.webhook_timeout_s, context=self.tls)
            ok = True
        except Refused as exc:
            error = f"refused: {exc}"
        except SendError as exc:
            status, error = exc.status, str(exc)
        # The endpoint id only: a URL may carry a token in its query.
        log.info("webhook delivery %s to endpoint %s attempt %s: %s", c.msg_id, c.endpoint_id, c.attempt,
                 "delivered" if ok else error)
        return c, ok, status, error

    def _record(self, outcomes: list[tuple[service.Claimed, bool, int | None, str]]) -> None:
        """All of a round's outcomes in one transaction (one commit, not one per delivery).

        If this fails, or the process dies first, the leases run out and the deliveries are
        sent again: at least once.
        """
        s = self.settings
        try:
            with transaction(self.sessions) as session:
                service.record_many(session, outcomes=outcomes, base_s=s.webhook_backoff_base_s,
                                    max_s=s.webhook_backoff_max_s, disable_after=s.webhook_disable_after_failures)
        except Exception:  # noqa: BLE001 - the leases run out and the deliveries are retried
            log.exception("could not record %d webhook deliveries", len(outcomes))
