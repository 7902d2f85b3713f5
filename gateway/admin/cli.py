"""``isthmus admin ...``: the admin API from the command line."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import click

from gateway.cli_client import Client, _emit, _table, client_options, fmt

ACCOUNT_COLUMNS = [("name", "ACCOUNT"), ("parent", "PARENT"), ("shares", "SHARES"), ("gpus", "GPUS"),
                   ("max_gpus", "MAX_GPUS"), ("used_gpu_hours", "USED_H"), ("remaining_gpu_hours", "LEFT_H"),
                   ("factor", "FAIRSHARE")]
LEDGER_COLUMNS = [("id", "ID"), ("at", "AT"), ("account", "ACCOUNT"), ("kind", "KIND"), ("job_id", "JOB"),
                  ("pool", "POOL"), ("gpus", "GPUS"), ("gpu_seconds", "GPU_S"), ("actor", "ACTOR"),
                  ("reason", "REASON")]
SSHARE_COLUMNS = [("account", "Account"), ("shares", "RawShares"), ("norm_shares", "NormShares"),
                  ("raw_usage_gpu_hours", "RawUsage(GPU-h)"), ("effective_usage", "EffectvUsage"),
                  ("factor", "FairShare")]


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


for _kind in ("credit", "debit", "refund"):
    admin.command(_kind)(_adjust(_kind))


@admin.command("ledger")
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


@admin.command("usage")
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


@admin.command("fairshare")
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


@admin.group("weight", cls=_WeightGroup)
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


POOL_COLUMNS = [("name", "POOL"), ("kind", "KIND"), ("state", "STATE"), ("weight", "WEIGHT"), ("cost", "COST"),
                ("gpu_types", "GPU_TYPES"), ("configured", "CONFIGURED"), ("set_by", "SET_BY")]


@admin.group()
def pool() -> None:
    """List pools; drain, disable, enable or re-weight one."""


def _pool_row(p: dict) -> dict:
    return {**p, "gpu_types": ",".join(p["gpu_types"]) or "-",
            "set_by": ", ".join(sorted({b for b in (p["state_by"], p["weight_by"]) if b})) or "config"}


@pool.command("list")
@client_options
def pool_list(url, token, as_json) -> None:
    """Every pool the gateway knows, configured now or before."""
    data = Client(url, token).call("GET", "/v1/admin/pools")
    _emit(data, as_json, lambda rows: _table([_pool_row(p) for p in rows], POOL_COLUMNS))


def _patch_pool(name: str, body: dict, url, token, as_json) -> None:
    data = Client(url, token).call("PATCH", f"/v1/admin/pools/{name}", json=body)
    _emit(data, as_json, lambda p: _table([_pool_row(p)], POOL_COLUMNS))


@pool.command("drain")
@click.argument("name")
@client_options
def pool_drain(name, url, token, as_json) -> None:
    """Route nothing new to NAME; its running jobs finish."""
    _patch_pool(name, {"state": "draining"}, url, token, as_json)


@pool.command("disable")
@click.argument("name")
@client_options
def pool_disable(name, url, token, as_json) -> None:
    """Route nothing new to NAME (jobs there are left as they are)."""
    _patch_pool(name, {"state": "disabled"}, url, token, as_json)


@pool.command("enable")
@click.argument("name")
@client_options
def pool_enable(name, url, token, as_json) -> None:
    """Put NAME back in service."""
    _patch_pool(name, {"state": "active"}, url, token, as_json)


@pool.command("weight")
@click.argument("name")
@click.argument("weight", type=float)
@client_options
def pool_weight(name, weight, url, token, as_json) -> None:
    """Set NAME's routing weight (> 0; higher wins when several pools fit)."""
    _patch_pool(name, {"weight": weight}, url, token, as_json)


WINDOW_COLUMNS = [("id", "ID"), ("source", "SOURCE"), ("start", "START"), ("end", "END"), ("nodes", "NODES"),
                  ("kind", "KIND"), ("reason", "REASON")]


@pool.group("window")
def window() -> None:
    """Maintenance windows on a pool: list, add, delete (docs/planning.md)."""


def _window_row(w: dict) -> dict:
    return {**w, "nodes": ",".join(w["nodes"]) or "(all)", "end": w["end"] or "(no end)",
            "kind": ("maintenance" if w["maintenance"] else "reservation") + (" (now)" if w["active"] else "")}


@window.command("list")
@click.argument("name")
@client_options
def window_list(name, url, token, as_json) -> None:
    """NAME's windows that have not ended: the gateway's and the backend's own (e.g. Slurm MAINT reservations)."""
    data = Client(url, token).call("GET", f"/v1/admin/pools/{name}/windows")
    _emit(data, as_json, lambda rows: _table([_window_row(w) for w in rows], WINDOW_COLUMNS) if rows else
          f"no window on {name}")


def _when(value: str, option: str) -> str:
    """An RFC 3339 time with a zone, or ``now`` / ``now+DURATION`` (e.g. ``now+2h``), as UTC RFC 3339."""
    from datetime import datetime, timedelta

    from gateway.domain.shapes import parse_duration_s

    text = value.strip()
    if text == "now" or text.startswith("now+"):
        try:
            delta = parse_duration_s(text[4:]) if text != "now" else 0
        except ValueError as exc:
            raise click.BadParameter(f"{value!r}: {exc}", param_hint=option) from None
        return (datetime.now(UTC) + timedelta(seconds=delta)).isoformat(timespec="seconds")
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a time: give e.g. 2026-12-08T06:00:00Z or now+2h",
                                 param_hint=option) from None
    if at.tzinfo is None:
        raise click.BadParameter(f"{value!r} has no time zone (add Z for UTC)", param_hint=option)
    return at.isoformat()


def _span(start: str, end: str | None, duration: str | None) -> tuple[str, str]:
    """(start, end) as RFC 3339 from --start and exactly one of --end and --duration."""
    from datetime import datetime, timedelta

    from gateway.domain.shapes import parse_duration_s

    if (end is None) == (duration is None):
        raise click.UsageError("give exactly one of --end and --duration")
    begins = _when(start, "--start")
    if duration is None:
        return begins, _when(end, "--end")
    try:
        seconds = parse_duration_s(duration)
    except ValueError as exc:
        raise click.BadParameter(f"{duration!r}: {exc}", param_hint="--duration") from None
    return begins, (datetime.fromisoformat(begins) + timedelta(seconds=seconds)).isoformat()


@window.command("add")
@click.argument("name")
@click.option("--start", required=True, help="When it starts: RFC 3339 with a zone, `now` or `now+2h`.")
@click.option("--end", default=None, help="When it ends (RFC 3339 with a zone or `now+6h`).")
@click.option("--duration", default=None, help="How long, instead of --end (e.g. 4h, 90m, 1-00:00:00).")
@click.option("--reason", required=True, help="Why, in words (shown to users whose jobs wait).")
@click.option("--node", "nodes", multiple=True, help="Only this node (repeat); none: the whole pool.")
@client_options
def window_add(name, start, end, duration, reason, nodes, url, token, as_json) -> None:
    """Set a maintenance window on NAME: no gang whose limit would cross it starts on what it takes."""
    begins, ends = _span(start, end, duration)
    data = Client(url, token).call("POST", f"/v1/admin/pools/{name}/windows",
                                   json={"start": begins, "end": ends, "reason": reason, "nodes": list(nodes)})
    _emit(data, as_json, lambda w: f"window {w['id']} on {w['pool']}: {w['words']}")


@window.command("delete")
@click.argument("name")
@click.argument("window_id")
@client_options
def window_delete(name, window_id, url, token, as_json) -> None:
    """Delete a window made through the gateway (a backend's own is deleted in the backend)."""
    Client(url, token).call("DELETE", f"/v1/admin/pools/{name}/windows/{window_id}")
    _emit({"deleted": window_id}, as_json, lambda d: f"deleted window {window_id} of {name}")


RESERVATION_COLUMNS = [("id", "ID"), ("account", "ACCOUNT"), ("pool", "POOL"), ("amount", "HOLDS"),
                       ("start", "START"), ("end", "END"), ("status", "STATUS"), ("backend", "IN THE BACKEND"),
                       ("reason", "REASON")]


@admin.group()
def reservation() -> None:
    """Advance reservations: GPUs or nodes of a pool held for an account (docs/planning.md)."""


def _reservation_row(r: dict) -> dict:
    amount = f"{r['gpus']} GPUs" if r["gpus"] is not None else f"{r['nodes']} nodes"
    status = ("SHORT: " + r["shortfall"]) if r["shortfall"] else ("under way" if r["active"] else "planned")
    return {**r, "amount": amount, "status": status, "backend": r.get("native") or "-"}


@reservation.command("list")
@client_options
def reservation_list(url, token, as_json) -> None:
    """Every advance reservation that has not ended, flagged when its pool cannot honour it."""
    data = Client(url, token).call("GET", "/v1/admin/reservations")
    _emit(data, as_json, lambda rows: _table([_reservation_row(r) for r in rows], RESERVATION_COLUMNS) if rows else
          "no advance reservation")


@reservation.command("add")
@click.argument("account")
@click.option("--pool", default=None, help="The pool (or give --gpu-type).")
@click.option("--gpu-type", default=None, help="Any pool with this GPU type: the gateway picks one, once.")
@click.option("--gpus", type=int, default=None, help="How many GPUs (or give --nodes).")
@click.option("--nodes", type=int, default=None, help="How many whole nodes (or give --gpus).")
@click.option("--start", required=True, help="When it starts: RFC 3339 with a zone, `now` or `now+2h`.")
@click.option("--end", default=None, help="When it ends (RFC 3339 with a zone or `now+6h`).")
@click.option("--duration", default=None, help="How long, instead of --end (e.g. 2-00:00:00, 48h).")
@click.option("--reason", required=True, help="Why, in words (shown to others whose jobs wait).")
@client_options
def reservation_add(account, pool, gpu_type, gpus, nodes, start, end, duration, reason, url, token, as_json) -> None:
    """Hold GPUs or nodes of a pool for ACCOUNT from --start to --end."""
    begins, ends = _span(start, end, duration)
    body = {"account": account, "pool": pool, "gpu_type": gpu_type, "gpus": gpus, "nodes": nodes, "start": begins,
            "end": ends, "reason": reason}
    data = Client(url, token).call("POST", "/v1/admin/reservations",
                                   json={k: v for k, v in body.items() if v is not None})
    _emit(data, as_json, lambda r: f"reservation {r['id']}: {r['words']}" +
          (f"\nin the backend: {r['native_note']}" if r.get("native_note") else "") +
          (f"\nwarning: {r['shortfall']}" if r["shortfall"] else ""))


@reservation.command("delete")
@click.argument("reservation_id")
@client_options
def reservation_delete(reservation_id, url, token, as_json) -> None:
    """Delete an advance reservation (jobs running in it go on)."""
    Client(url, token).call("DELETE", f"/v1/admin/reservations/{reservation_id}")
    _emit({"deleted": reservation_id}, as_json, lambda d: f"deleted reservation {reservation_id}")
