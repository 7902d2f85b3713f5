"""Fault injection for the crash tests: pauses inside the dispatcher's two crash windows.

Not a setting: production code never builds one except from the test-only environment
variables below, and a gateway without them gets :data:`NONE`. The crash tests
(tests/dispatch/test_faults.py, test_shutdown.py) start real ``isthmus worker`` processes
with them, so that ``kill -9`` lands exactly between the claim and the submission, or
between the submission and its record (docs/dispatch.md, "Crash safety").
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping

PAUSE_AFTER_CLAIM = "ISTHMUS_TEST_PAUSE_AFTER_CLAIM_S"
PAUSE_AFTER_SUBMIT = "ISTHMUS_TEST_PAUSE_AFTER_SUBMIT_S"


@dataclasses.dataclass(frozen=True)
class Faults:
    pause_after_claim_s: float = 0.0  # crash window 1: claimed and committed, not yet submitted
    pause_after_submit_s: float = 0.0  # crash window 2: submitted, not yet recorded

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Faults:
        def seconds(name: str) -> float:
            value = float(env.get(name) or 0)
            if not 0 <= value <= 600:
                raise ValueError(f"{name} must be between 0 and 600 s")
            return value

        return cls(pause_after_claim_s=seconds(PAUSE_AFTER_CLAIM), pause_after_submit_s=seconds(PAUSE_AFTER_SUBMIT))

    def after_claim(self) -> None:
        if self.pause_after_claim_s:
            time.sleep(self.pause_after_claim_s)

    def after_submit(self) -> None:
        if self.pause_after_submit_s:
            time.sleep(self.pause_after_submit_s)


NONE = Faults()
