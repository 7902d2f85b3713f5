"""The quota rules have one implementation (issue #46): every refusal a user can read about
concurrent GPUs, GPU-hour budgets and limits that can never admit a gang is worded, and so
judged, only in gateway/domain/quota.py. A second copy of a rule would have to word it again."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "gateway" / "domain" / "quota.py"
# The words of each judgement (docs/ledger.md): the concurrent-GPU and per-pool refusal, the
# budget's refusal, its verdicts at submit, the requeue's, never-admissible.
PHRASES = ("concurrent GPUs in use", "committed of", "GPU-hour budget is", "GPU-hours left and this job",
           "another run needs", "can never run: it asks")


def _sources():
    for top in ("gateway", "adapters"):
        yield from (p for p in sorted((ROOT / top).rglob("*.py")) if p != RULES)


def test_every_quota_judgement_is_worded_only_in_the_pure_rules():
    found = {(str(p.relative_to(ROOT)), phrase) for p in _sources() for phrase in PHRASES if phrase in p.read_text()}
    assert found == set(), found
    text = RULES.read_text()
    assert all(phrase in text for phrase in PHRASES)  # the phrases are still the rules' own


def test_the_checker_finds_a_copy():
    assert any(phrase in 'f"{name}: {used} of {limit} concurrent GPUs in use"' for phrase in PHRASES)
