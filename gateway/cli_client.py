"""Helpers shared by the client commands (`isthmus jobs`, `isthmus admin ...`)."""

from __future__ import annotations

import json
from typing import Any

import click

DEFAULT_URL = "http://127.0.0.1:8080"


class Client:
    def __init__(self, url: str, token: str | None):
        import httpx

        if not token:
            from gateway.cli_login import cached_access_token

            token = cached_access_token()  # `isthmus login`; refreshed when about to expire
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=30)

    def call(self, method: str, path: str, **kw) -> Any:
        return self.request(method, path, **kw)[1]

    def request(self, method: str, path: str, **kw) -> tuple[int, Any]:
        """(HTTP status, JSON body); a problem answer becomes a one-message ClickException."""
        import httpx

        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"cannot reach the gateway: {exc}") from None
        if r.status_code >= 400:
            try:
                p = r.json()
                msg = f"{p.get('status')} {p.get('title')}: {p.get('detail') or ''}"
                for e in p.get("errors") or []:
                    msg += f"\n  {e['field']}: {e['message']}"
            except ValueError:
                msg = f"{r.status_code}: {r.text[:500]}"
            raise click.ClickException(msg)
        return r.status_code, (r.json() if r.content else None)  # 204: no body


def client_options(f):
    f = click.option("--url", envvar="ISTHMUS_URL", default=DEFAULT_URL, show_default=True, show_envvar=True,
                     help="the gateway's base URL")(f)
    f = click.option("--token", envvar="ISTHMUS_TOKEN", default=None, show_envvar=True,
                     help="bearer token (default: the one `isthmus login` cached; `isthmus token` in dev mode)")(f)
    f = click.option("--json", "as_json", is_flag=True, help="print the API's JSON instead of text")(f)
    return f


def fmt(value: Any) -> str:
    """A value as a person reads it: no Python reprs (None, True, [..], {..})."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt(v)}" for k, v in value.items()) or "-"
    return str(value)


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    cells = [[fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _emit(data: Any, as_json: bool, render) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render(data))
