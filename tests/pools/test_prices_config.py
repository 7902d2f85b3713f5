"""Prices in the pools file (issue #49, item 3): per pool, per GPU type or ``default``, as
Decimals exactly as written, and a site-wide ``currency``; every mistake one line naming the
pool and the field (docs/pools.md, "Prices")."""

from __future__ import annotations

import textwrap
from decimal import Decimal

import pytest

from gateway.kit.settings import Settings
from gateway.pools import config
from gateway.pools.adapters import BackendConfigError
from tests.pools.test_config import KEY

HEAD = f"""
pools:
  - name: slurm-h100
    kind: slurm
    settings: {{rest_url: "http://127.0.0.1:16820", jwt_key_path: {KEY}}}
"""


def _load(tmp_path, prices: str = "", top: str = ""):
    path = tmp_path / "pools.yaml"
    path.write_text(textwrap.dedent(top) + textwrap.dedent(HEAD) + textwrap.indent(textwrap.dedent(prices), "    "))
    settings = Settings(pools_file=str(path))
    pools = config.load(settings)
    return config.load_prices(settings, pools)


def test_prices_are_decimals_as_written_and_gpu_types_case_insensitive(tmp_path):
    p = _load(tmp_path, "prices: {H100: 2.35, default: 1.1, a100: '0.000001'}\n", "currency: EUR\n")
    assert p.currency == "EUR"
    assert p.price("slurm-h100", "h100") == Decimal("2.35")  # not 2.35000000000000008882
    assert p.price("slurm-h100", "NVIDIA-H100") == Decimal("1.1") and p.price("slurm-h100", None) == Decimal("1.1")
    assert p.price("slurm-h100", "a100") == Decimal("0.000001")
    assert p.price("elsewhere", "h100") is None


def test_without_prices_nothing_is_priced_and_no_currency_is_shown(tmp_path):
    p = _load(tmp_path)
    assert p.currency == "" and p.price("slurm-h100", "h100") is None
    assert config.load_prices(Settings(pools_file="", backends="{}"), []).pools == {}


@pytest.mark.parametrize("prices, top, words", [
    ("prices: 2.5\n", "", "pool 'slurm-h100', field 'prices': must be a mapping"),
    ("prices: {h100: -1}\n", "", "field 'prices.h100': must be a price per GPU-hour"),
    ("prices: {h100: cheap}\n", "", "field 'prices.h100'"),
    ("prices: {h100: 1.0000001}\n", "", "at most 6 decimals"),
    ("prices: {h100: .nan}\n", "", "field 'prices.h100'"),
    ("prices: {h100: true}\n", "", "field 'prices.h100'"),
    ("prices: {'h 100': 1}\n", "", "'h 100' is not a GPU type name or default"),
    ("prices: {H100: 1, h100: 2}\n", "", "field 'prices.h100': priced twice"),
    ("", "currency: euro\n", "field 'currency': an ISO 4217 code"),
    ("", "currency: 978\n", "field 'currency'"),
    ("", "currencies: EUR\n", "must be a mapping with the keys pools"),
])
def test_each_mistake_is_one_line_naming_the_pool_and_field(tmp_path, prices, top, words):
    with pytest.raises(BackendConfigError) as e:
        _load(tmp_path, prices, top)
    assert words in str(e.value) and "\n" not in str(e.value)
