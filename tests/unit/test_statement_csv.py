"""A statement's CSV opens in a spreadsheet as it is (issue #49, item 3): RFC 4180 with a
header row, CRLF line ends, ISO dates, plain decimal numbers with '.', and no cell that a
spreadsheet would run as a formula. Parsed back with Python's csv module to the same figures."""

from __future__ import annotations

import csv
import io
from datetime import date
from decimal import Decimal

from gateway.domain.prices import PriceList, cost, parse_price
from gateway.ledger.statement_views import CSV_COLUMNS, to_csv, to_out
from gateway.ledger.statements import AttemptPart, Budget, Line, Statement

PRICES = PriceList(currency="EUR", pools={"slurm": {"h100": Decimal("2.35"), "default": Decimal("1E+2")}})


def _line(account, kind, pool, gpu_type, gpu_seconds, attempts=None):
    price = PRICES.price(pool, gpu_type)
    return Line(account=account, kind=kind, pool=pool, gpu_type=gpu_type, jobs=len(attempts or ()), entries=3,
                gpu_seconds=gpu_seconds, price=price, cost=cost(gpu_seconds, price), attempts=attempts)


def _statement() -> Statement:
    lines = (
        _line("team-a", "usage", "slurm", "h100", 7 * 3600 + 1,
              (AttemptPart("job-1", 1, 3600), AttemptPart("job-1", 2, 6 * 3600 + 1))),
        _line("team-a", "usage", "slurm", "a100", 1800, (AttemptPart("job-2", 1, 1800),)),
        _line("team-a", "credit", None, None, -3600),
        _line("=HYPERLINK(\"x\")", "debit", "slurm", None, 18),  # no such name can be made; the guard holds anyway
    )
    return Statement(account="team-a", children=True, since=date(2026, 11, 1), until=date(2026, 12, 1),
                     currency="EUR", accounts=("team-a", "=HYPERLINK(\"x\")"), lines=lines,
                     budget=Budget(gpu_seconds=None, source=None, period="month", used_gpu_seconds=0))


def test_the_rounding_rule():
    assert cost(1, Decimal("2.35")) == Decimal("0.00")
    assert cost(7 * 3600 + 1, Decimal("2.35")) == Decimal("16.45")  # 16.450652... -> 16.45
    assert cost(-3600, Decimal("0.005")) == Decimal("-0.01")  # half up: away from zero
    assert cost(3600, None) is None
    assert parse_price(2.35) == Decimal("2.35") and parse_price("0.1") == Decimal("0.1")
    for bad in (-1, "x", float("nan"), True, "1.0000001", None, 10**7):
        assert parse_price(bad) is None, bad
    assert PRICES.price("slurm", "H100") == Decimal("2.35")
    assert PRICES.price("slurm", "a100") == PRICES.price("slurm", None) == Decimal(100)
    assert PRICES.price("kubernetes", "h100") is None


def test_the_csv_parses_back_to_the_same_figures():
    st = _statement()
    text = to_csv(st)
    assert text.startswith(",".join(CSV_COLUMNS) + "\r\n") and text.endswith("\r\n")
    assert "\n" not in text.replace("\r\n", "")
    text.encode("ascii")  # plain UTF-8 (names, codes and numbers are ASCII): no BOM, no encoding guess
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    lines = [r for r in rows if r["kind"] not in ("attempt", "total")]
    assert [int(r["gpu_seconds"]) for r in lines] == [x.gpu_seconds for x in st.lines]
    assert [r["cost"] and Decimal(r["cost"]) for r in lines] == [x.cost if x.cost is not None else ""
                                                                  for x in st.lines]
    total = rows[-1]
    assert total["kind"] == "total" and int(total["gpu_seconds"]) == st.gpu_seconds == sum(
        int(r["gpu_seconds"]) for r in lines)
    assert Decimal(total["cost"]) == st.cost == sum(Decimal(r["cost"]) for r in lines if r["cost"])
    assert {r["period_start"] for r in rows} == {"2026-11-01"} and {r["period_end"] for r in rows} == {"2026-12-01"}
    attempts = [r for r in rows if r["kind"] == "attempt"]
    assert [(r["job_id"], r["attempt"], r["gpu_seconds"], r["cost"]) for r in attempts] == [
        ("job-1", "1", "3600", ""), ("job-1", "2", "21601", ""), ("job-2", "1", "1800", "")]
    # numbers as a spreadsheet reads them: '.', no exponent, negatives as plain -N
    assert lines[0]["price_per_gpu_hour"] == "2.35" and lines[1]["price_per_gpu_hour"] == "100"
    assert lines[2]["gpu_seconds"] == "-3600" and lines[2]["gpu_hours"] == "-1.0000"
    # a cell a spreadsheet would run as a formula is text
    assert lines[3]["account"] == "'=HYPERLINK(\"x\")"
    assert all(not v.startswith(("=", "+", "@")) for r in rows for v in r.values())


def test_json_money_is_decimal_text():
    out = to_out(_statement()).model_dump(mode="json")
    assert out["cost"] == str(_statement().cost) and out["lines"][0]["price_per_gpu_hour"] == "2.35"
    assert out["gpu_seconds"] == sum(line["gpu_seconds"] for line in out["lines"])
    assert [s["account"] for s in out["subtotals"]] == ["team-a", "=HYPERLINK(\"x\")"]
