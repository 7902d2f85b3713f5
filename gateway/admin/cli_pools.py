"""``isthmus admin pool|reservation``: pools, their maintenance windows and advance
reservations, from the command line (registered on ``isthmus admin`` by cli.py)."""

from __future__ import annotations

from datetime import UTC

import click

from gateway.cli_client import Client, _emit, _table, client_options

POOL_COLUMNS = [("name", "POOL"), ("kind", "KIND"), ("state", "STATE"), ("weight", "WEIGHT"), ("cost", "COST"),
                ("gpu_types", "GPU_TYPES"), ("configured", "CONFIGURED"), ("set_by", "SET_BY")]


@click.group()
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


@click.group()
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
