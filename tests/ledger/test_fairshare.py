"""Fair share against the hand-computed example in docs/ledger.md (half-life 7 days)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gateway.kit.db import transaction
from gateway.ledger import reading as ledger_reading
from gateway.ledger import service as ledger
from tests.ledger.dbfixtures import T0, add_account, add_job

H = 7 * 24 * 3600
GPU_H = 3600


def _run(s, account, gpus, hours, pool, ended_at):
    job = add_job(s, account, gpus=gpus, time_limit_s=int(hours * 3600), pool=pool)
    start = ended_at - timedelta(hours=hours)
    ledger.reserve(s, job=job, pool=pool, actor="t", now=start)
    ledger.record_start(s, job=job, started_at=start, actor="t")
    ledger.record_finish(s, job=job, started_at=start, ended_at=ended_at, actor="t", half_life_s=H)


def test_classic_fairshare_worked_example(factory):
    now = T0 + timedelta(days=14)
    with transaction(factory) as s:
        add_account(s, "org-x", shares=3)
        add_account(s, "org-y", shares=1)
        add_account(s, "team-a", parent="org-x", shares=1)
        add_account(s, "team-b", parent="org-x", shares=1)
        # team-a: 100 GPU-h on Slurm a week ago (decays to 50) + 20 GPU-h on Kubernetes now
        _run(s, "team-a", 4, 25, "slurm", now - timedelta(days=7))
        _run(s, "team-a", 2, 10, "kubernetes", now)
        # org-y: 40 GPU-h two weeks ago (decays to 10)
        _run(s, "org-y", 8, 5, "kubernetes", now - timedelta(days=14))
    with transaction(factory) as s:
        fs = ledger_reading.fairshare(s, now=now, half_life_s=H)
    assert fs["team-a"].raw_usage == pytest.approx(70 * GPU_H)
    assert fs["org-x"].raw_usage == pytest.approx(70 * GPU_H)
    assert fs["org-y"].raw_usage == pytest.approx(10 * GPU_H)
    expect = {  # account: (S, U_A, U_E, F)
        "org-x": (0.75, 0.875, 0.875, 0.44544936),
        "org-y": (0.25, 0.125, 0.125, 0.70710678),
        "team-a": (0.375, 0.875, 0.875, 0.19842513),
        "team-b": (0.375, 0.0, 0.4375, 0.44544936),
    }
    for name, (S, ua, ue, f) in expect.items():
        got = fs[name]
        assert (got.norm_shares, got.norm_usage, got.effective_usage, got.factor) == pytest.approx(
            (S, ua, ue, f), abs=1e-6), name

    # A week later: everything has halved (ratios, hence factors, unchanged) ...
    later = now + timedelta(days=7)
    with transaction(factory) as s:
        fs = ledger_reading.fairshare(s, now=later, half_life_s=H)
        assert fs["team-a"].raw_usage == pytest.approx(35 * GPU_H)
        assert fs["team-a"].factor == pytest.approx(0.19842513, abs=1e-6)
        # ... then team-b runs 35 GPU-h, ending now: team-a and team-b are level.
        _run(s, "team-b", 7, 5, "slurm", later)
    with transaction(factory) as s:
        fs = ledger_reading.fairshare(s, now=later, half_life_s=H)
    expect = {"org-x": 0.42207040, "org-y": 0.83123790, "team-a": 0.27420624, "team-b": 0.27420624}
    for name, f in expect.items():
        assert fs[name].factor == pytest.approx(f, abs=1e-6), name
    assert fs["team-a"].effective_usage == pytest.approx(0.7)
