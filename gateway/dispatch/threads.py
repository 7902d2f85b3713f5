"""The threads: dispatch (woken by submissions), reconcile (polling) and one watch per feed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gateway.dispatch.common import log


class ThreadsMixin:
    def run_once(self) -> None:
        self.recover_round()
        self.dispatch_round()
        self.reconcile_round()

    def _loop(self, rounds: Callable[[], None], wake: threading.Event | None) -> None:
        while not self._stop.is_set():
            if wake is not None:
                wake.clear()
            try:
                rounds()
            except Exception:  # noqa: BLE001 - the loop must survive DB restarts and bugs alike
                log.exception("dispatch loop iteration failed; retrying")
                self._stop.wait(min(5.0, self.settings.dispatch_interval_s * 5))
                continue
            (wake or self._stop).wait(self.settings.dispatch_interval_s)

    def _dispatch_rounds(self) -> None:
        self.recover_round()
        self.dispatch_round()

    def wake(self) -> None:
        """Start the next round now (a job was submitted or cancelled in this process)."""
        self._wake.set()
        self._reconcile_wake.set()  # a cancel needs its active call on the backend

    def _reconcile_loop(self) -> None:
        """Poll every ``dispatch_interval_s``; when woken sooner, only cancelling jobs."""
        while not self._stop.is_set():
            self._reconcile_wake.clear()
            try:
                if time.monotonic() >= self._poll_due:
                    self._poll_due = time.monotonic() + self.settings.dispatch_interval_s
                    self.reconcile_round(full=False)
                    if time.monotonic() >= self._accrue_due:
                        # Its query scans the running reservations: a tenth of the accrual
                        # interval between rounds is plenty, and keeps it off the 1 s poll.
                        self._accrue_due = time.monotonic() + self.settings.usage_accrual_interval_s / 10
                        self.accrue_round()
                else:
                    self.reconcile_round(full=False, only_cancelling=True)
            except Exception:  # noqa: BLE001 - the loop must survive DB restarts and bugs alike
                log.exception("reconcile round failed; retrying")
                self._stop.wait(min(5.0, self.settings.dispatch_interval_s * 5))
                continue
            self._reconcile_wake.wait(max(0.0, self._poll_due - time.monotonic()))

    def run_forever(self) -> None:
        """Dispatch (woken by submissions), reconcile (polling) and one watch per backend with a
        change feed, each in its own thread, until stopped.

        Separate threads keep a new job's dispatch from waiting behind the status calls of
        every running job, and a slow backend's feed from delaying another's.
        """
        threads = [threading.Thread(target=self._reconcile_loop, name="isthmus-reconciler", daemon=True)]
        threads += [threading.Thread(target=self.watch_backend, args=(pool,), name=f"isthmus-watch-{pool}",
                                     daemon=True) for pool in self.watched]
        for t in threads:
            t.start()
        try:
            self._loop(self._dispatch_rounds, self._wake)
        finally:
            self._stop.set()
            self._stop_watches()
            for t in threads:
                t.join(10)

    def _stop_watches(self) -> None:
        for stop in list(self._watch_stops):
            stop.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="isthmus-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10) -> None:
        self._stop.set()
        self._wake.set()
        self._reconcile_wake.set()
        self._stop_watches()
        if self._thread:
            self._thread.join(timeout_s)
        self._stop_output_keeper()
