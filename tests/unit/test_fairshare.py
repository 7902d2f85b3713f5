"""Fair-share maths (gateway/domain/fairshare.py) on plain numbers; the ledger's reading of
them from the database is tests/ledger/test_fairshare.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.domain.fairshare import compute_fairshare, decay

T0 = datetime(2026, 1, 1, tzinfo=UTC)
H = 7 * 24 * 3600


def test_decay_halves_usage_every_half_life():
    assert decay(100.0, T0, T0, H) == 100.0
    assert decay(100.0, T0, T0 + timedelta(seconds=H), H) == pytest.approx(50.0)
    assert decay(100.0, T0, T0 + timedelta(seconds=3 * H), H) == pytest.approx(12.5)
    # backwards (usage reported late is decayed to the later reference time the other way)
    assert decay(50.0, T0 + timedelta(seconds=H), T0, H) == pytest.approx(100.0)


def test_zero_shares_and_idle_tree():
    fs = compute_fairshare({"a": (None, 0), "b": (None, 2), "c": ("b", 1)}, {})
    assert fs["a"].factor == 0.0 and fs["a"].norm_shares == 0.0
    assert fs["b"].factor == 1.0 and fs["c"].factor == 1.0


def test_equal_shares_favour_the_account_that_used_less():
    fs = compute_fairshare({"a": (None, 1), "b": (None, 1)}, {"a": 3.0, "b": 1.0})
    assert fs["a"].norm_shares == fs["b"].norm_shares == 0.5
    assert fs["a"].norm_usage == pytest.approx(0.75) and fs["b"].norm_usage == pytest.approx(0.25)
    assert fs["a"].factor == pytest.approx(2 ** -1.5) and fs["b"].factor == pytest.approx(2 ** -0.5)
    assert fs["b"].factor > fs["a"].factor


def test_a_childs_usage_counts_for_its_parent_and_an_only_child_inherits_its_parents_usage():
    tree = {"org": (None, 1), "team": ("org", 1), "other": (None, 1)}
    fs = compute_fairshare(tree, {"team": 2.0, "other": 2.0})
    assert fs["org"].raw_usage == 2.0 and fs["org"].norm_usage == pytest.approx(0.5)
    assert fs["team"].norm_shares == pytest.approx(0.5)  # all of its parent's half
    assert fs["team"].effective_usage == pytest.approx(fs["org"].effective_usage)
    assert fs["team"].level_shares == 1 and fs["org"].level_shares == 2


def test_an_account_whose_parent_is_unknown_is_a_root():
    fs = compute_fairshare({"a": ("gone", 1), "b": (None, 1)}, {})
    assert fs["a"].parent is None and fs["a"].norm_shares == 0.5
