"""``isthmus``: run the gateway and talk to it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from gateway.cli_client import Client, _emit, _table, client_options



def _settings():
    from gateway.kit.settings import get_settings

    get_settings.cache_clear()
    return get_settings()


def run_migrations(database_url: str, revision: str = "head") -> None:
    from alembic import command
    from alembic.config import Config

    root = Path(__file__).resolve().parent.parent
    cfg = Config(str(root / "alembic.ini"))
    cfg.set_main_option("script_location", str(root / "migrations"))
    cfg.attributes["database_url"] = database_url
    command.upgrade(cfg, revision)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="isthmus")
def main() -> None:
    """Isthmus: one gateway for GPU gang jobs on Slurm and Kubernetes."""


# ----------------------------------------------------------------- server side


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=int, help="uvicorn worker processes")
@click.option("--dev", is_flag=True, help="dev mode: trust the local development issuer")
@click.option("--migrate/--no-migrate", default=None,
              help="apply migrations first (default: yes on SQLite, no on Postgres)")
def serve(host: str, port: int, workers: int, dev: bool, migrate: bool | None) -> None:
    """Run the gateway."""
    import uvicorn

    if dev:
        os.environ["ISTHMUS_DEV_MODE"] = "true"
    settings = _settings()
    if migrate or (migrate is None and settings.is_sqlite):
        run_migrations(settings.database_url)
    from gateway.identity.setup import ConfigurationError, build_authenticator

    try:
        build_authenticator(settings)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    if settings.dev_mode and settings.log_format == "text":  # in JSON, the app logs the same warning
        click.secho("DEV MODE: tokens from `isthmus token` are trusted. Never run this in production.",
                    fg="yellow", err=True)
    # Body size and body timeouts are enforced by the app (gateway/kit/limits.py); these
    # are the limits only the server can set (docs/security.md, finding 5). log_config=None:
    # each worker process configures logging itself (gateway/kit/logs.py).
    uvicorn.run("gateway.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=settings.log_level, access_log=False, log_config=None, http="h11",
                limit_concurrency=settings.max_connections, timeout_keep_alive=5,
                h11_max_incomplete_event_size=settings.max_header_bytes)


@main.command()
@click.option("--once", is_flag=True, help="run one recover/dispatch/reconcile round and exit")
def worker(once: bool) -> None:
    """Run the dispatcher/reconciler without the HTTP API (any number may run at once)."""
    import logging
    import signal

    from gateway.dispatch.backends import build_backends
    from gateway.dispatch.service import Dispatcher
    from gateway.kit.db import make_engine, make_sessionmaker

    settings = _settings()
    from gateway.kit.logs import configure as configure_logging

    configure_logging(settings.log_level, settings.log_format)
    backends = build_backends(settings.backends)
    if not backends:
        raise click.ClickException("no backends configured: set ISTHMUS_BACKENDS (see docs/dispatch.md)")
    engine = make_engine(settings.database_url, pool_size=settings.database_pool_size)
    dispatcher = Dispatcher(sessions=make_sessionmaker(engine), backends=backends, settings=settings)
    if once:
        dispatcher.run_once()
        return
    signal.signal(signal.SIGTERM, lambda *_: dispatcher._stop.set())
    click.echo(f"worker: dispatching to {', '.join(sorted(backends))}", err=True)
    try:
        dispatcher.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        engine.dispose()


@main.command()
@click.option("--revision", default="head", show_default=True)
def migrate(revision: str) -> None:
    """Apply database migrations (ISTHMUS_DATABASE_URL)."""
    settings = _settings()
    run_migrations(settings.database_url, revision)
    click.echo(f"database at {revision}")


@main.command()
@click.option("--user", required=True, help="POSIX user name (preferred_username)")
@click.option("--groups", default="", help="comma-separated groups = accounts, e.g. team-a,team-b")
@click.option("--admin", is_flag=True, help="add the admin role")
@click.option("--lifetime", default=3600, show_default=True, type=int, help="seconds")
def token(user: str, groups: str, admin: bool, lifetime: int) -> None:
    """Mint a token from the local development issuer (dev mode only)."""
    settings = _settings()
    if not settings.dev_mode:
        raise click.ClickException("the development issuer is off: set ISTHMUS_DEV_MODE=true")
    from gateway.identity.setup import build_dev_issuer

    issuer = build_dev_issuer(settings)
    click.echo(issuer.mint(user=user, groups=[g for g in groups.split(",") if g], admin=admin,
                           lifetime_s=lifetime))


@main.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="write to a file instead of stdout")
def openapi(output: str | None) -> None:
    """Print the OpenAPI document the gateway serves."""
    text = openapi_json()
    if output:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=False)


def openapi_json() -> str:
    from gateway.app import create_app
    from gateway.kit.settings import Settings

    import tempfile

    # Dev mode only so the app builds without an identity provider; the throwaway key
    # must not land in the working directory.
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Settings(dev_mode=True, database_url="sqlite://", dev_key_path=Path(tmp) / "k.pem"))
        return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


@main.group()
def account() -> None:
    """Bootstrap accounts directly in the database (the admin API is for running gateways)."""


@account.command("create")
@click.argument("name")
@click.option("--parent", default=None)
@click.option("--shares", default=1, show_default=True, type=int)
def account_create(name: str, parent: str | None, shares: int) -> None:
    from gateway.accounts.models import Account
    from gateway.kit.db import make_engine, make_sessionmaker, transaction

    settings = _settings()
    engine = make_engine(settings.database_url)
    with transaction(make_sessionmaker(engine)) as session:
        if session.get(Account, name) is None:
            session.add(Account(name=name, parent_name=parent, shares=shares))
            click.echo(f"created account {name}")
        else:
            click.echo(f"account {name} exists")
    engine.dispose()


# ----------------------------------------------------------------- client side


JOB_COLUMNS = [("id", "ID"), ("name", "NAME"), ("account", "ACCOUNT"), ("user", "USER"), ("state", "STATE"),
               ("assigned_backend", "POOL"), ("total_gpus", "GPUS"), ("created_at", "SUBMITTED")]


def _job_detail(job: dict) -> str:
    keys = ["id", "name", "account", "user", "state", "state_reason", "backend", "assigned_backend",
            "routing_reason", "command", "workers", "gpus_per_worker", "total_gpus", "cpus_per_worker",
            "memory_per_worker", "gpu_type", "time_limit", "priority", "backend_job_id", "nodes",
            "exit_code", "created_at", "started_at", "ended_at"]
    return "\n".join(f"{k + ':':18} {json.dumps(job.get(k)) if isinstance(job.get(k), list) else job.get(k)}"
                     for k in keys if k in job)


@main.command()
@click.argument("file", type=click.File("r"))
@click.option("--idempotency-key", default=None)
@client_options
def submit(file, idempotency_key: str | None, url: str, token: str | None, as_json: bool) -> None:
    """Submit a job from a YAML or JSON file ('-' for stdin)."""
    import yaml

    try:
        spec = yaml.safe_load(file)
    except yaml.YAMLError as exc:
        raise click.ClickException(f"cannot parse {file.name}: {exc}") from None
    if not isinstance(spec, dict):
        raise click.ClickException(f"{file.name}: expected a mapping with the job spec")
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    job = Client(url, token).call("POST", "/v1/jobs", json=spec, headers=headers)
    _emit(job, as_json, lambda j: f"submitted job {j['id']} ({j['name']}), state {j['state']}")


@main.command()
@click.option("--state", multiple=True)
@click.option("--account")
@click.option("--backend", type=click.Choice(["auto", "slurm", "kubernetes"]))
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--all", "all_pages", is_flag=True, help="follow every page")
@client_options
def jobs(state, account, backend, limit, all_pages, url, token, as_json) -> None:
    """List jobs you can see, newest first."""
    client = Client(url, token)
    params: dict[str, Any] = {"limit": limit}
    if state:
        params["state"] = list(state)
    if account:
        params["account"] = account
    if backend:
        params["backend"] = backend
    items: list[dict] = []
    while True:
        page = client.call("GET", "/v1/jobs", params=params)
        items.extend(page["items"])
        if not (all_pages and page["next_cursor"]):
            break
        params["cursor"] = page["next_cursor"]
    _emit(items, as_json, lambda rows: _table(rows, JOB_COLUMNS))


@main.command()
@click.argument("job_id")
@click.option("--events", is_flag=True, help="also print the job's history")
@client_options
def job(job_id, events, url, token, as_json) -> None:
    """Show one job."""
    client = Client(url, token)
    data = client.call("GET", f"/v1/jobs/{job_id}")
    if events:
        data = {**data, "events": client.call("GET", f"/v1/jobs/{job_id}/events")["items"]}

    def render(j: dict) -> str:
        out = _job_detail(j)
        if "events" in j:
            out += "\n\n" + _table(j["events"], [("at", "AT"), ("actor", "ACTOR"), ("kind", "KIND"),
                                                  ("from_state", "FROM"), ("to_state", "TO"), ("reason", "REASON")])
        return out

    _emit(data, as_json, render)


@main.command()
@click.argument("job_id")
@client_options
def cancel(job_id, url, token, as_json) -> None:
    """Cancel a job."""
    data = Client(url, token).call("POST", f"/v1/jobs/{job_id}/cancel")
    _emit(data, as_json, lambda j: f"job {j['id']}: {j['state']}")


from gateway.admin.cli import admin as _admin  # noqa: E402  (after main exists)

main.add_command(_admin)  # `isthmus admin ...`


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
