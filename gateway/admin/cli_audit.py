"""``isthmus admin audit list|verify|prune``: the audit log from the command line (registered
on ``isthmus admin`` by cli.py), through the admin API like every admin command."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from gateway.cli_client import Client, _emit, _table, client_options

AUDIT_COLUMNS = [("id", "ID"), ("at", "AT"), ("subject", "SUBJECT"), ("username", "USER"), ("action", "ACTION"),
                 ("target", "TARGET"), ("account", "ACCOUNT"), ("change", "CHANGE")]


@click.group("audit")
def audit() -> None:
    """The audit log: who changed what (docs/ledger.md, "Audit log")."""


def _change(before: Any, after: Any) -> str:
    """What changed, in one short line: the keys whose values differ (or the whole thing)."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        return ", ".join(f"{k}: {json.dumps(before.get(k))} -> {json.dumps(after.get(k))}" for k in keys) or "-"
    if before is None:
        return "created " + json.dumps(after, sort_keys=True)[:120]
    if after is None:
        return "removed"
    return json.dumps(after)[:120]


def _row(r: dict) -> dict:
    return {**r, "target": f"{r['target_kind']} {r['target_name']}", "change": _change(r["before"], r["after"])}


@audit.command("list")
@click.option("--action", multiple=True, help="only this action (repeatable); account.* for every action under it")
@click.option("--account", help="only records about this account")
@click.option("--subject", help="only changes by this token subject (system:... for the gateway's own)")
@click.option("--since", help="from this time on (ISO 8601)")
@click.option("--until", help="before this time (ISO 8601)")
@click.option("--limit", type=int, default=100, show_default=True, help="records per page")
@click.option("--all", "all_pages", is_flag=True, help="follow every page")
@click.option("--mine", is_flag=True, help="as a coordinator: read --account's records through "
                                          "/v1/accounts/{account}/audit (no admin role needed)")
@client_options
def audit_list(action, account, subject, since, until, limit, all_pages, mine, url, token, as_json) -> None:
    """Audit records, newest first."""
    if mine and not account:
        raise click.UsageError("--mine needs --account")
    params: dict[str, Any] = {"limit": limit}
    for k, v in (("subject", subject), ("since", since), ("until", until)):
        if v:
            params[k] = v
    if account and not mine:
        params["account"] = account
    if action:
        params["action"] = list(action)
    path = f"/v1/accounts/{account}/audit" if mine else "/v1/admin/audit"
    client, items = Client(url, token), []
    while True:
        page = client.call("GET", path, params=params)
        items += page["items"]
        if not (all_pages and page["next_cursor"]):
            break
        params["cursor"] = page["next_cursor"]
    _emit(items, as_json, lambda rows: _table([_row(r) for r in rows], AUDIT_COLUMNS))


@audit.command("verify")
@client_options
def audit_verify(url, token, as_json) -> None:
    """Check the hash chain; exit 1 naming the first record that does not hold."""
    v = Client(url, token).call("GET", "/v1/admin/audit/verify")
    if as_json:
        click.echo(json.dumps(v, indent=2))
    elif v["ok"]:
        start = " (starts after pruned records)" if v["starts_after_prune"] else ""
        click.echo(f"ok: {v['checked']} records, {v['first_id'] or '-'} to {v['last_id'] or '-'}{start}")
    else:
        click.echo(f"BROKEN at record {v['broken_id']}: {v['reason']} ({v['checked']} records before it hold)",
                   err=True)
    if not v["ok"]:
        sys.exit(1)


@audit.command("prune")
@client_options
def audit_prune(url, token, as_json) -> None:
    """Delete the records older than ISTHMUS_AUDIT_RETENTION_DAYS (run it daily, e.g. from cron)."""
    data = Client(url, token).call("POST", "/v1/admin/audit/prune")
    _emit(data, as_json, lambda d: f"deleted {d['deleted']} audit records older than {d['retention_days']} days"
          if d["retention_days"] else "retention is 0: audit records are kept forever")
