"""``isthmus admin ...``: the admin API from the command line.

Here the group itself and the accounts (create, update, delete, quotas, members); the ledger's
commands are in cli_ledger.py, the pools' (windows, advance reservations) in cli_pools.py."""

from __future__ import annotations

from typing import Any

import click

from gateway.admin import cli_audit, cli_ledger, cli_pools, cli_statement
from gateway.cli_client import Client, _emit, _table, client_options, fmt

ACCOUNT_COLUMNS = [("name", "ACCOUNT"), ("parent", "PARENT"), ("shares", "SHARES"), ("gpus", "GPUS"),
                   ("max_gpus", "MAX_GPUS"), ("used_gpu_hours", "USED_H"), ("remaining_gpu_hours", "LEFT_H"),
                   ("factor", "FAIRSHARE")]


@click.group()
def admin() -> None:
    """Administer accounts, quotas, credits and reports (needs the admin role)."""


def _own_or_inherited(value, source: str | None, account: str) -> str:
    """``value``, marked ``(org)`` when it is an ancestor's limit or budget rather than this account's."""
    if value is None:
        return "-"
    return fmt(value) + ("" if source in (None, account) else f" ({source})")


def _account_row(a: dict) -> dict:
    name, q = a["account"], a["quota"]
    budget_from = q["budget_gpu_hours"].get("source")
    return {"name": name, "parent": a["parent"], "shares": a["shares"],
            "gpus": a["balance"]["reserved_gpus"],
            "max_gpus": _own_or_inherited(q["max_gpus"]["value"], q["max_gpus"].get("source"), name),
            "used_gpu_hours": _own_or_inherited(a["used_gpu_hours"], budget_from, name),
            "remaining_gpu_hours": _own_or_inherited(a["remaining_gpu_hours"], budget_from, name),
            "factor": f"{a['fairshare']['factor']:.4f}" if a.get("fairshare") else None}


@admin.group()
def accounts() -> None:
    """Create, change and delete accounts."""


@accounts.command("list")
@client_options
def accounts_list(url, token, as_json) -> None:
    """All accounts with quotas, usage and fair share.

    A value followed by an account name in parentheses, e.g. ``32 (org)``, is inherited:
    MAX_GPUS is that ancestor's limit, USED_H and LEFT_H its budget, shared by its
    subaccounts (credits included, so USED_H may be negative).
    """
    data = Client(url, token).call("GET", "/v1/admin/accounts")
    _emit(data, as_json, lambda rows: _table([_account_row(a) for a in rows], ACCOUNT_COLUMNS))


@accounts.command("create")
@click.argument("name")
@click.option("--parent", help="parent account (limits and budgets are inherited from it)")
@click.option("--shares", type=int, default=1, show_default=True, help="fair-share shares among its siblings")
@click.option("--description", default="", help="free text")
@client_options
def accounts_create(name, parent, shares, description, url, token, as_json) -> None:
    """Create an account."""
    data = Client(url, token).call("POST", "/v1/admin/accounts", json={
        "name": name, "parent": parent, "shares": shares, "description": description})
    _emit(data, as_json, lambda a: f"created account {a['account']}")


@accounts.command("update")
@click.argument("name")
@click.option("--parent", help="new parent ('-' for none)")
@click.option("--shares", type=int, help="new fair-share shares")
@click.option("--description", help="new description")
@client_options
def accounts_update(name, parent, shares, description, url, token, as_json) -> None:
    """Change an account's parent, shares or description."""
    body: dict[str, Any] = {}
    if parent is not None:
        body["parent"] = None if parent == "-" else parent
    if shares is not None:
        body["shares"] = shares
    if description is not None:
        body["description"] = description
    data = Client(url, token).call("PATCH", f"/v1/admin/accounts/{name}", json=body)
    _emit(data, as_json, lambda a: f"updated account {a['account']}")


@accounts.command("delete")
@click.argument("name")
@client_options
def accounts_delete(name, url, token, as_json) -> None:
    """Delete an account (refused while it has children, active jobs or history)."""
    client = Client(url, token)
    r = client.http.delete(f"/v1/admin/accounts/{name}")
    if r.status_code >= 400:
        client.call("DELETE", f"/v1/admin/accounts/{name}")  # renders the problem
    click.echo(f"deleted account {name}")


@admin.command("quota")
@click.argument("name")
@click.option("--max-gpus", type=int, help="GPUs the account's running jobs may hold at once, all pools")
@click.option("--max-gpus-pool", "per_pool", multiple=True, metavar="POOL=N",
              help="the same in one pool (repeatable); POOL= (no number) removes that pool's limit")
@click.option("--guaranteed-gpus", type=int,
              help="GPUs the subtree's work holds without ever being preempted (docs/recovery.md)")
@click.option("--guaranteed-gpus-pool", "guaranteed_pool", multiple=True, metavar="POOL=N",
              help="the same in one pool (repeatable); POOL= (no number) removes that pool's guarantee")
@click.option("--max-gpus-slurm", type=int, help="deprecated: --max-gpus-pool slurm=N")
@click.option("--max-gpus-kubernetes", type=int, help="deprecated: --max-gpus-pool kubernetes=N")
@click.option("--budget-gpu-hours", type=float, help="GPU-hours per budget period")
@click.option("--budget-period", type=click.Choice(["month", "rolling"]),
              help="calendar month, or a rolling window of --budget-window-days")
@click.option("--budget-window-days", type=int, help="length of a rolling budget window")
@click.option("--max-queued-jobs", type=int, help="jobs the account may have waiting")
@click.option("--max-queued-jobs-per-user", type=int, help="jobs one user may have waiting in the account")
@click.option("--unset", multiple=True, help="remove a limit (field name, repeatable), e.g. --unset max_gpus")
@client_options
def quota(name, unset, per_pool, guaranteed_pool, url, token, as_json, **limits) -> None:
    """Set an account's quotas (unset limits are inherited from ancestors)."""
    body: dict[str, Any] = {k: v for k, v in limits.items() if v is not None}
    for field, items, hint in (("max_gpus_per_pool", per_pool, "--max-gpus-pool"),
                               ("guaranteed_gpus_per_pool", guaranteed_pool, "--guaranteed-gpus-pool")):
        for item in items:
            pool_name, sep, n = item.partition("=")
            if not sep or (n and not n.isdigit()):
                raise click.BadParameter(f"{item!r}: expected POOL=N, e.g. slurm-h100=16", param_hint=hint)
            body.setdefault(field, {})[pool_name] = int(n) if n else None
    body.update({u.replace("-", "_"): None for u in unset})
    data = Client(url, token).call("PUT", f"/v1/admin/accounts/{name}/quota", json=body)
    def limits(q: dict) -> list[tuple[str, dict]]:
        # Per-pool limits as max_gpus[POOL]; the deprecated per-kind fields are left out.
        out = [(k, v) for k, v in q.items() if isinstance(v, dict) and "value" in v
               and k not in ("max_gpus_slurm", "max_gpus_kubernetes")]
        return out + [(f"{field}[{p}]", v) for field in ("max_gpus", "guaranteed_gpus")
                      for p, v in sorted((q.get(f"{field}_per_pool") or {}).items())]

    _emit(data, as_json, lambda a: "\n".join(f"{k:26} {v['value']!s:>12}  (from {v['source'] or '-'})"
                                             for k, v in limits(a["quota"])))


@admin.group()
def members() -> None:
    """Recorded members and coordinators."""


@members.command("list")
@click.argument("account")
@client_options
def members_list(account, url, token, as_json) -> None:
    data = Client(url, token).call("GET", f"/v1/admin/accounts/{account}/members")
    _emit(data, as_json, lambda rows: _table(rows, [("username", "USER"), ("role", "ROLE")]))


@members.command("add")
@click.argument("account")
@click.argument("username")
@click.option("--coordinator", is_flag=True, help="may manage the account's subtree")
@client_options
def members_add(account, username, coordinator, url, token, as_json) -> None:
    data = Client(url, token).call("PUT", f"/v1/admin/accounts/{account}/members/{username}",
                                   json={"role": "coordinator" if coordinator else "member"})
    _emit(data, as_json, lambda m: f"{m['username']} is {m['role']} of {m['account']}")


@members.command("remove")
@click.argument("account")
@click.argument("username")
@client_options
def members_remove(account, username, url, token, as_json) -> None:
    client = Client(url, token)
    r = client.http.delete(f"/v1/admin/accounts/{account}/members/{username}")
    if r.status_code >= 400:
        client.call("DELETE", f"/v1/admin/accounts/{account}/members/{username}")
    click.echo(f"removed {username} from {account}")


# The ledger's commands and the pools' live in their own modules, one reason to change each.
for _command in (*cli_ledger.ADJUSTMENTS, cli_ledger.ledger_cmd, cli_ledger.usage, cli_ledger.fairshare,
                 cli_ledger.weight, cli_pools.pool, cli_pools.reservation, cli_audit.audit,
                 cli_statement.statement):
    admin.add_command(_command)
