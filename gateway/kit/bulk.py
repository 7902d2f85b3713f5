"""Many rows in one statement: ``INSERT ... SELECT FROM json_to_recordset(rows)`` on Postgres.

A dispatch round writes about a hundred rows to each of a few tables. Sent as an
executemany (one prepared statement per row, pipelined) that was ~11 ms per 100 rows on the
shared test host; as one statement whose columns are arrays (``unnest``), ~6 ms, most of it
psycopg escaping every element of every array in Python (a claim's routing reason is ~500
characters, sent three times). As ONE parameter, the rows as a JSON document (``json.dumps``
is C), the same statement costs about half of that again, the server parsing the document
as it reads it. The statement's text does not depend on the row count (prepared once).
SQLite keeps executemany.

Values: what ``json.dumps`` writes as is (str, int, float, bool, None, and dict/list for a
JSON column); datetimes and dates as ISO 8601 (an aware datetime keeps its offset). A JSON
null becomes SQL NULL in every column, as the array form wrote it.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import json
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, String, Table, text
from sqlalchemy.engine import Connection


def _default(v: Any) -> Any:
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, (decimal.Decimal, uuid.UUID)):
        return str(v)
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def _document(rows: list[dict[str, Any]]) -> str:
    # allow_nan=False: a NaN would be invalid JSON on the server; fail here with the reason.
    return json.dumps(rows, default=_default, allow_nan=False, separators=(",", ":"))


def record_columns(table: Table, names: tuple[str, ...], dialect) -> str:
    """``"a" type, "b" type, ...``: the record's columns, typed as ``table``'s."""
    quote = dialect.identifier_preparer.quote
    return ", ".join(f"{quote(n)} {table.c[n].type.compile(dialect=dialect)}" for n in names)


@functools.lru_cache(maxsize=64)
def _insert_sql(table: Table, columns: tuple[str, ...], dialect) -> Any:
    quote = dialect.identifier_preparer.quote
    cols = ", ".join(quote(c) for c in columns)
    picked = ", ".join(f"r.{quote(c)}" for c in columns)
    return text(f"INSERT INTO {quote(table.name)} ({cols}) SELECT {picked} "
                f"FROM json_to_recordset(CAST(:rows AS json)) AS r({record_columns(table, columns, dialect)})")


def insert_rows(conn: Connection, table: Table, rows, *, shared: dict[str, Any] | None = None,
                columns: Sequence[str] | None = None, chunk: int = 2000) -> None:
    """Insert many rows in the connection's transaction: THE bulk insert, its per-dialect fork here.

    ``rows`` are dicts with the same keys: one statement over a JSON document on Postgres
    (about a hundred rows of a dispatch round), else executemany. With ``columns``, ``rows``
    are tuples of those columns' values (JSON columns already encoded as text), each plus
    ``shared`` (the values every row has): Postgres streams them with ``COPY``, the shared part
    formatted once, which is what makes a 10,000-task array one short request
    (bench/bench_arrays.py); psycopg's executemany would still send one INSERT per row. Same
    transaction either way: a failure writes nothing.
    """
    if not rows:
        return
    if columns is None:
        if conn.dialect.name != "postgresql":
            conn.execute(table.insert(), rows)
            return
        conn.execute(_insert_sql(table, tuple(rows[0]), conn.dialect), {"rows": _document(rows)})
        return
    shared = shared or {}
    json_cols = {c.name for c in table.c if isinstance(c.type, JSON)}
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), [
            {**shared, **{c: json.loads(v) if c in json_cols and v is not None else v
                          for c, v in zip(columns, row, strict=True)}}
            for row in rows])
        return
    names = [*shared, *columns]
    head = "".join(_copy_text(v, k in json_cols) + "\t" for k, v in shared.items())
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({', '.join(names)}) FROM STDIN") as copy:
        for start in range(0, len(rows), chunk):
            copy.write("".join([head + "\t".join([_copy_text(v) for v in row]) + "\n"
                                for row in rows[start:start + chunk]]))


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _copy_text(value: Any, is_json: bool = False) -> str:
    """One value in COPY's text format (docs: COPY, "Text Format")."""
    if type(value) is str and not is_json:
        if "\\" in value or "\n" in value or "\r" in value or "\t" in value:
            return value.translate(_COPY_ESCAPES)
        return value
    if value is None:
        return "\\N"
    if is_json and not isinstance(value, str):
        value = json.dumps(value)
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, str):
        # Most values need no escape; looking costs far less than translating.
        if "\\" in value or "\n" in value or "\r" in value or "\t" in value:
            return value.translate(_COPY_ESCAPES)
        return value
    raise TypeError(f"no COPY text form for {type(value).__name__}")


def document(rows: list[dict[str, Any]]) -> str:
    """``rows`` as the JSON document :func:`recordset` reads (one bound parameter)."""
    return _document(rows)


def recordset(table: Table, columns: tuple[str, ...], *, param: str = "rows", name: str = "r"):
    """Postgres: ``json_to_recordset(CAST(:param AS json)) AS name(col type, ...)``, typed as ``table``'s columns.

    A FROM clause for SQLAlchemy statements (they keep the ORM's autoflush when built on an
    entity); bind :func:`document` of the rows to ``param``.
    """
    from sqlalchemy import bindparam, cast, column, func
    from sqlalchemy.dialects.postgresql import JSON as PG_JSON

    return (func.json_to_recordset(cast(bindparam(param, type_=String()), PG_JSON))
            .table_valued(*(column(c, table.c[c].type) for c in columns)).render_derived(name=name, with_types=True))
