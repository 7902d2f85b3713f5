"""``isthmus admin credit|debit|refund|ledger|usage|fairshare|weight``: the ledger, its reports
and the billing weights, from the command line (registered on ``isthmus admin`` by cli.py)."""

from __future__ import annotations

from typing import Any

import click

from gateway.cli_client import Client, _emit, _table, client_options

LEDGER_COLUMNS = [("id", "ID"), ("at", "AT"), ("account", "ACCOUNT"), ("kind", "KIND"), ("job_id", "JOB"),
                  ("pool", "POOL"), ("gpus", "GPUS"), ("gpu_seconds", "GPU_S"), ("actor", "ACTOR"),
                  ("reason", "REASON")]
SSHARE_COLUMNS = [("account", "Account"), ("shares", "RawShares"), ("norm_shares", "NormShares"),
                  ("raw_usage_gpu_hours", "RawUsage(GPU-h)"), ("effective_usage", "EffectvUsage"),
                  ("factor", "FairShare")]


def _adjust(kind: str):
    @click.argument("account")
    @click.argument("gpu_hours", type=float)
    @click.option("--reason", required=True, help="why (kept in the ledger, shown to the account)")
    @click.option("--job", "job_id", help="the job this entry is about (required for a refund)")
    @click.option("--pool", help="the pool it is about (a pool name)")
    @client_options
    def cmd(account, gpu_hours, reason, job_id, pool, url, token, as_json) -> None:
        body = {"account": account, "kind": kind, "gpu_hours": gpu_hours, "reason": reason}
        if job_id:
            body["job_id"] = job_id
        if pool:
            body["pool"] = pool
        e = Client(url, token).call("POST", "/v1/admin/ledger/adjustments", json=body)
        _emit(e, as_json, lambda x: f"ledger entry {x['id']}: {kind} {gpu_hours} GPU-h on {account}")

    cmd.__doc__ = {"credit": "Grant GPU-hours back to an account's budget.",
                   "debit": "Take GPU-hours from an account's budget (revokes a credit).",
                   "refund": "Give back (part of) a finished job's usage (--job)."}[kind]
    return cmd



ADJUSTMENTS = tuple(click.command(kind)(_adjust(kind)) for kind in ("credit", "debit", "refund"))


@click.command("ledger")
@click.option("--account", help="only this account's entries")
@click.option("--subaccounts", is_flag=True, help="with --account: its subaccounts' entries too")
@click.option("--job", "job_id", help="only this job's entries")
@click.option("--kind", multiple=True, help="only entries of this kind (repeatable): reserve, start, usage, "
                                            "release, requeue, credit, debit, refund")
@click.option("--pool", help="only this pool's entries (a pool name)")
@click.option("--since", help="from this time on (ISO 8601, e.g. 2026-11-01 or 2026-11-01T12:00:00Z)")
@click.option("--until", help="before this time (ISO 8601)")
@click.option("--limit", type=int, default=100, show_default=True, help="entries per page")
@click.option("--all", "all_pages", is_flag=True, help="follow every page")
@client_options
def ledger_cmd(account, subaccounts, job_id, kind, pool, since, until, limit, all_pages, url, token, as_json):
    """Ledger entries, oldest first."""
    params: dict[str, Any] = {"limit": limit, "include_subaccounts": subaccounts}
    for k, v in (("account", account), ("job_id", job_id), ("pool", pool), ("since", since), ("until", until)):
        if v:
            params[k] = v
    if kind:
        params["kind"] = list(kind)
    client, items = Client(url, token), []
    while True:
        page = client.call("GET", "/v1/admin/ledger", params=params)
        items += page["items"]
        if not (all_pages and page["next_cursor"]):
            break
        params["cursor"] = page["next_cursor"]
    _emit(items, as_json, lambda rows: _table(rows, LEDGER_COLUMNS))


@click.command("usage")
@click.option("--since", help="from this time on (ISO 8601)")
@click.option("--until", help="before this time (ISO 8601)")
@click.option("--period", type=click.Choice(["month", "day"]), default="month", show_default=True,
              help="one row per account, pool and this period")
@click.option("--account", help="only this account (and its subaccounts)")
@click.option("--csv", "as_csv", is_flag=True, help="print CSV (for spreadsheets)")
@client_options
def usage(since, until, period, account, as_csv, url, token, as_json) -> None:
    """Usage per account x pool x period."""
    params = {k: v for k, v in (("since", since), ("until", until), ("period", period), ("account", account)) if v}
    client = Client(url, token)
    if as_csv:
        r = client.http.get("/v1/admin/usage", params={**params, "format": "csv"})
        if r.status_code >= 400:
            client.call("GET", "/v1/admin/usage", params=params)
        click.echo(r.text, nl=False)
        return
    data = client.call("GET", "/v1/admin/usage", params=params)
    _emit(data, as_json, lambda d: _table(d["items"], [("account", "ACCOUNT"), ("pool", "POOL"),
                                                        ("period", "PERIOD"), ("jobs", "JOBS"),
                                                        ("net_gpu_hours", "GPU_HOURS")]))


@click.command("fairshare")
@client_options
def fairshare(url, token, as_json) -> None:
    """The fair-share table (like sshare)."""
    data = Client(url, token).call("GET", "/v1/admin/fairshare")

    def render(d: dict) -> str:
        depth = {}
        rows = []
        # One column per pool with usage: the decayed usage split over pools (sums to RawUsage).
        pools = sorted({p for f in d["items"] for p in f.get("raw_usage_gpu_hours_per_pool") or {}})
        for f in d["items"]:
            depth[f["account"]] = depth.get(f["parent"], -1) + 1 if f["parent"] else 0
            per_pool = f.get("raw_usage_gpu_hours_per_pool") or {}
            rows.append({**f, "account": " " * depth[f["account"]] + f["account"],
                         **{k: f"{f[k]:.6f}" for k in ("norm_shares", "effective_usage", "factor")},
                         "raw_usage_gpu_hours": f"{f['raw_usage_gpu_hours']:.1f}",
                         **{f"pool:{p}": f"{per_pool.get(p, 0.0):.1f}" for p in pools}})
        columns = SSHARE_COLUMNS[:4] + [(f"pool:{p}", f"{p}(GPU-h)") for p in pools] + SSHARE_COLUMNS[4:]
        return _table(rows, columns)

    _emit(data, as_json, render)


class _WeightGroup(click.Group):
    """``weight list`` and ``weight set``; ``weight POOL TYPE W`` still means ``set``."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["set", *args]
        return super().resolve_command(ctx, args)


@click.group("weight", cls=_WeightGroup)
def weight() -> None:
    """Billing weights: what one GPU-hour of a GPU type costs in a pool."""


@weight.command("set")
@click.argument("pool")
@click.argument("gpu_type")
@click.argument("weight", type=float)
@client_options
def weight_set(pool, gpu_type, weight, url, token, as_json) -> None:
    """Set a GPU type's billing weight in a pool ('*' = pool default)."""
    data = Client(url, token).call("PUT", f"/v1/admin/billing-weights/{pool}/{gpu_type}", json={"weight": weight})
    _emit(data, as_json, lambda w: f"{w['pool']}/{w['gpu_type']}: weight {w['weight']}")


@weight.command("list")
@client_options
def weight_list(url, token, as_json) -> None:
    """Every billing weight set (types not listed weigh 1.0)."""
    data = Client(url, token).call("GET", "/v1/admin/billing-weights")
    _emit(data, as_json, lambda rows: _table(rows, [("pool", "POOL"), ("gpu_type", "GPU_TYPE"),
                                                     ("weight", "WEIGHT")]) if rows else
          "no billing weights set: every GPU-hour weighs 1.0")
