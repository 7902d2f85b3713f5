"""Helpers shared by the client commands (`isthmus jobs`, `isthmus admin ...`)."""

from __future__ import annotations

import json
from typing import Any

import click

DEFAULT_URL = "http://127.0.0.1:8080"


class Client:
    def __init__(self, url: str, token: str | None):
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=30)

    def call(self, method: str, path: str, **kw) -> Any:
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
        return r.json()


def client_options(f):
    f = click.option("--url", envvar="ISTHMUS_URL", default=DEFAULT_URL, show_default=True)(f)
    f = click.option("--token", envvar="ISTHMUS_TOKEN", default=None, help="bearer token (or ISTHMUS_TOKEN)")(f)
    f = click.option("--json", "as_json", is_flag=True, help="print JSON")(f)
    return f


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    cells = [[str(r.get(k) if r.get(k) is not None else "-") for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(columns, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _emit(data: Any, as_json: bool, render) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render(data))
