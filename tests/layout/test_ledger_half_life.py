"""The fair-share half-life has one holder above the ledger: ``Ledger`` (gateway/ledger/decayed.py),
made from the settings once (issue #47, item 1). No router, page, collector or dispatcher
part hands ``half_life_s`` to a ledger call of its own any more: a new call site that does
could read another half-life than the charges were made with."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ABOVE_THE_LEDGER = ("api", "ui", "dispatch", "metrics", "webhooks", "admin", "flows", "jobs")


def test_no_half_life_travels_above_the_ledger():
    found = []
    for package in ABOVE_THE_LEDGER:
        for path in sorted((REPO / "gateway" / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bhalf_life_s\s*=(?!=)", line) and "Ledger" not in line:
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    # The admin fair-share table reports the half-life it used (read from the Ledger).
    assert [f for f in found if "FairShareTable(" not in f] == []


def test_the_bound_ledger_reads_at_the_settings_half_life():
    from gateway.kit.settings import Settings
    from gateway.ledger.decayed import Ledger

    assert Ledger.of(Settings(fairshare_half_life_s=3600)).half_life_s == 3600
