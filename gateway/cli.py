"""``isthmus``: run the gateway and talk to it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click


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
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=int, help="port to listen on")
@click.option("--workers", default=1, show_default=True, type=int, help="uvicorn worker processes")
@click.option("--dev", is_flag=True, help="dev mode (same as ISTHMUS_DEV_MODE=true): trust the local development issuer")
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
    from gateway.api.metrics import check_access as check_metrics_access
    from gateway.identity.setup import ConfigurationError, build_authenticator

    try:
        build_authenticator(settings)
        check_metrics_access(settings)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    _check_pools(settings)
    if settings.dev_mode and settings.log_format == "text":  # in JSON, the app logs the same warning
        click.secho("DEV MODE: tokens from `isthmus token` are trusted. Never run this in production.",
                    fg="yellow", err=True)
    # Body size and body timeouts are enforced by the app (gateway/identity/bodylimit.py); these
    # are the limits only the server can set (docs/security.md, finding 5). log_config=None:
    # each worker process configures logging itself (gateway/kit/logs.py).
    uvicorn.run("gateway.app:create_served_app", factory=True, host=host, port=port, workers=workers,
                log_level=settings.log_level, access_log=False, log_config=None, http="h11",
                limit_concurrency=settings.max_connections, timeout_keep_alive=5,
                timeout_worker_healthcheck=settings.worker_healthcheck_s,
                h11_max_incomplete_event_size=settings.max_header_bytes)


def _check_pools(settings) -> None:
    """Refuse settings that cannot work (one line, exit 1); log which pools are unhealthy now
    (in the log format the gateway uses, so a JSON log stays all JSON)."""
    import logging

    from gateway.kit.logs import configure as configure_logging
    from gateway.pools.adapters import BackendConfigError
    from gateway.pools.service import probe

    try:
        backends, _ = _pools_at_startup(settings)
    except BackendConfigError as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging(settings.log_level, settings.log_format, settings.log_repeat_window_s)
    log = logging.getLogger("isthmus.pools")
    if not backends:
        log.warning("no pool is configured (ISTHMUS_POOLS_FILE and ISTHMUS_BACKENDS are empty): jobs are accepted but wait "
                    "until one is; see docs/slurm.md and docs/kubernetes.md")
    try:
        for name, backend in sorted(backends.items()):
            health = probe(name, backend)
            if health.ok:
                log.info("pool %s: ok, %s", name, health.reason, extra={"pool": name})
            else:
                log.error("pool %s: UNAVAILABLE: %s (jobs wait until it recovers; GET /readyz and /v1/pools "
                          "show it)", name, health.reason, extra={"pool": name})
    finally:
        for backend in backends.values():
            backend.close()


def _pools_at_startup(settings) -> tuple[dict, Any]:
    """Validate the pools and their storages, reconcile the pools into the ``pool`` table,
    build their adapters, check the storages through them: (adapters, storage catalog).

    Raises BackendConfigError (one line) for a bad configuration or a vanished pool that
    still has active jobs. The table is only written when the database has it (migrated).
    """
    from sqlalchemy import inspect

    from gateway.kit.db import make_engine, make_sessionmaker
    from gateway.pools.config import build, load, load_storage
    from gateway.pools.service import reconcile_at_startup, storage_at_startup

    pools = load(settings)
    storage = load_storage(settings, pools)
    engine = make_engine(settings.database_url, pool_size=1)
    try:
        migrated = inspect(engine).has_table("pool")
        if migrated:
            reconcile_at_startup(make_sessionmaker(engine), pools)
        backends = build(pools)
        try:
            for note in storage_at_startup(make_sessionmaker(engine), storage, backends):
                click.echo(f"warning: {note}", err=True)
        except Exception:
            for backend in backends.values():
                backend.close()
            raise
    finally:
        engine.dispose()
    return backends, storage


@main.command()
@click.option("--once", is_flag=True, help="run one recover/dispatch/reconcile round and exit")
@click.option("--health-port", default=0, show_default=True, type=click.IntRange(0, 65535),
              envvar="ISTHMUS_WORKER_HEALTH_PORT",
              help="serve GET /healthz for a liveness probe on this port (0: none)")
@click.option("--health-host", default="0.0.0.0", show_default=True, envvar="ISTHMUS_WORKER_HEALTH_HOST",
              help="address the health port binds (a pod's probe reaches the pod's address)")
def worker(once: bool, health_port: int, health_host: str) -> None:
    """Run the dispatcher/reconciler without the HTTP API (any number may run at once)."""
    import signal

    from gateway.dispatch import Dispatcher
    from gateway.kit.db import make_engine, make_sessionmaker

    settings = _settings()
    from gateway.kit.logs import configure as configure_logging

    configure_logging(settings.log_level, settings.log_format, settings.log_repeat_window_s)
    from gateway.pools.adapters import BackendConfigError

    try:
        backends, storage = _pools_at_startup(settings)
    except BackendConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if not backends:
        raise click.ClickException("no pool configured: set ISTHMUS_POOLS_FILE or ISTHMUS_BACKENDS (see docs/pools.md)")
    engine = make_engine(settings.database_url, pool_size=settings.database_pool_size)
    sessions = make_sessionmaker(engine)
    from gateway.dispatch.faults import Faults

    # Fault injection only from its test-only variables (the crash tests): gateway/dispatch/faults.py.
    dispatcher = Dispatcher(sessions=sessions, backends=backends, settings=settings.dispatch,
                            faults=Faults.from_env(), storage=storage)
    from gateway.webhooks.worker import WebhookWorker

    webhooks = WebhookWorker(sessions=sessions, settings=settings.webhooks)  # docs/webhooks.md
    if once:
        dispatcher.run_once()
        webhooks.run_once()
        return
    if health_port:
        from gateway.dispatch.health import serve as serve_health

        # A loop that began no pass for this long is hung (a round's calls time out well before).
        stale_s = max(120.0, 30 * settings.dispatch_interval_s)
        serve_health(dispatcher.beats, host=health_host, port=health_port, stale_s=stale_s)
        click.echo(f"worker: GET /healthz on {health_host}:{health_port} (stuck after {stale_s:g} s)", err=True)
    signal.signal(signal.SIGTERM, lambda *_: dispatcher.request_stop())
    click.echo(f"worker: dispatching to {', '.join(sorted(backends))}", err=True)
    from gateway.app import follow_signals

    # Pools drained and reservations made through any API replica: acted on at once (docs/architecture.md).
    signals = follow_signals(settings.database_url, dispatcher, dispatching=True)
    webhooks.start()
    try:
        dispatcher.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if signals is not None:
            signals.stop()
        webhooks.stop()
        engine.dispose()


@main.command()
@click.option("--revision", default="head", show_default=True, help="Alembic revision to migrate to")
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
    """Mint a token from the local development issuer.

    Needs dev mode (ISTHMUS_DEV_MODE=true), here and in the gateway. The key is
    ISTHMUS_DEV_KEY_PATH, by default ~/.config/isthmus/dev-issuer-key.pem (under
    $XDG_CONFIG_HOME when set), whatever the current directory; it is created on first use.
    """
    settings = _settings()
    if not settings.dev_mode:
        raise click.ClickException("the development issuer is off: set ISTHMUS_DEV_MODE=true")
    from gateway.identity.setup import build_dev_issuer

    existed = Path(settings.dev_key_path).exists()
    issuer = build_dev_issuer(settings)
    if not existed:
        click.echo(f"created a development key at {settings.dev_key_path}", err=True)
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
    import tempfile

    from gateway.app import create_app
    from gateway.kit.settings import Settings

    # Dev mode only so the app builds without an identity provider; the throwaway key
    # must not land in the working directory.
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Settings(dev_mode=True, database_url="sqlite://", dev_key_path=Path(tmp) / "k.pem"))
        return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


@main.group()
def account() -> None:
    """Bootstrap: create accounts directly in the database (ISTHMUS_DATABASE_URL).

    For a running gateway use `isthmus admin accounts ...`; to see your own accounts,
    `isthmus accounts`.
    """


@account.command("create")
@click.argument("name")
@click.option("--parent", default=None, help="parent account (quotas and budgets are inherited from it)")
@click.option("--shares", default=1, show_default=True, type=int, help="fair-share shares among its siblings")
def account_create(name: str, parent: str | None, shares: int) -> None:
    import getpass

    from gateway.accounts.service import exists
    from gateway.admin import lifecycle
    from gateway.audit.service import Who
    from gateway.kit.db import make_engine, make_sessionmaker, transaction
    from gateway.kit.errors import GatewayError

    settings = _settings()
    engine = make_engine(settings.database_url)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            if exists(session, name):
                click.echo(f"account {name} exists")
                return
            lifecycle.create(session, name=name, parent_name=parent, shares=shares,
                             by=Who(subject="system:cli", username=getpass.getuser()))
            click.echo(f"created account {name}")
    except GatewayError as exc:  # a bad name, an unknown parent, a tree too deep: the API's words
        raise click.ClickException(str(exc)) from None
    finally:
        engine.dispose()


from gateway.admin.cli import admin as _admin  # noqa: E402  (after main exists)

main.add_command(_admin)  # `isthmus admin ...`

from gateway.cli_login import register as _register_login  # noqa: E402

_register_login(main)  # `isthmus login`, `isthmus logout`

from gateway.cli_user import COMMANDS as _USER_COMMANDS  # noqa: E402

for _command in _USER_COMMANDS:  # submit, jobs, job, logs, cancel, whoami, pools, accounts, usage
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
