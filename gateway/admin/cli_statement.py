"""``isthmus admin statement ACCOUNT``: an account's statement (docs/ledger.md, "Statements")
through GET /v1/accounts/{name}/statement, so the CLI reads what the API and the dashboard
show (registered on ``isthmus admin`` by cli.py). Admins, and the account's coordinators
with their own token."""

from __future__ import annotations

import click

from gateway.cli_client import Client, _emit, _table, client_options

LINE_COLUMNS = [("account", "ACCOUNT"), ("kind", "KIND"), ("pool", "POOL"), ("gpu_type", "GPU_TYPE"),
                ("jobs", "JOBS"), ("gpu_hours", "GPU_HOURS"), ("price_per_gpu_hour", "PRICE"), ("cost", "COST")]


def render(d: dict) -> str:
    """The statement as a table, its totals and the budget under it."""
    rows = [{**x, "gpu_hours": f"{x['gpu_hours']:.4f}"} for x in d["lines"]]
    currency = f" {d['currency']}" if d["currency"] else ""
    title = (f"statement of {d['account']}{' and its sub-accounts' if d['children'] else ''}, "
             f"{d['since']} to {d['until']} (until excluded, UTC)")
    out = [title, _table(rows, LINE_COLUMNS) if rows else "(no charges)"]
    out.append(f"total: {d['gpu_hours']:.4f} GPU-h ({d['gpu_seconds']} GPU-s), cost {d['cost']}{currency}"
               + (f"; {d['unpriced_gpu_seconds']} GPU-s unpriced" if d["unpriced_gpu_seconds"] else ""))
    b = d["budget"]
    if b["gpu_hours"] is not None:
        out.append(f"budget: {b['used_gpu_hours']:.4f} of {b['gpu_hours']:g} GPU-h used in this period "
                   f"(budget set on {b['source']}, per {b['period']})")
    return "\n".join(out)


@click.command("statement")
@click.argument("account")
@click.option("--since", help="first day (UTC, ISO 8601: 2026-11-01); default: the first of this month")
@click.option("--until", help="the day after the last (ISO 8601); default: the first of the next month")
@click.option("--children", is_flag=True, help="with the sub-accounts' lines")
@click.option("--attempts", is_flag=True, help="each line with the jobs' attempts behind it")
@click.option("--csv", "as_csv", is_flag=True, help="print CSV (opens in a spreadsheet as it is)")
@client_options
def statement(account, since, until, children, attempts, as_csv, url, token, as_json) -> None:
    """An account's statement: GPU-hours, cost, credits and adjustments, and budget for a period."""
    params: dict = {k: v for k, v in (("since", since), ("until", until)) if v}
    if children:
        params["children"] = "true"
    if attempts:
        params["detail"] = "attempts"
    client = Client(url, token)
    path = f"/v1/accounts/{account}/statement"
    if as_csv:
        r = client.http.get(path + ".csv", params=params)
        if r.status_code >= 400:
            client.call("GET", path, params=params)  # the error, in the CLI's words
        click.echo(r.text, nl=False)
        return
    _emit(client.call("GET", path, params=params), as_json, render)
