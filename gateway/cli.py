"""``isthmus``: run the gateway and talk to it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from gateway.cli_client import Client, _emit, _table, client_options, fmt



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
    from gateway.identity.setup import ConfigurationError, build_authenticator

    try:
        build_authenticator(settings)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    _check_pools(settings)
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


def _check_pools(settings) -> None:
    """Refuse settings that cannot work (one line, exit 1); log which pools are unhealthy now
    (in the log format the gateway uses, so a JSON log stays all JSON)."""
    import logging

    from gateway.dispatch.backends import BackendConfigError, build_backends
    from gateway.kit.logs import configure as configure_logging
    from gateway.pools.service import probe

    try:
        backends = build_backends(settings.backends)
    except BackendConfigError as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging(settings.log_level, settings.log_format)
    log = logging.getLogger("isthmus.pools")
    if not backends:
        log.warning("no pool is configured (ISTHMUS_BACKENDS is empty): jobs are accepted but wait "
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
    from gateway.dispatch.backends import BackendConfigError

    try:
        backends = build_backends(settings.backends)
    except BackendConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if not backends:
        raise click.ClickException("no pool configured: set ISTHMUS_BACKENDS (see docs/slurm.md, docs/kubernetes.md)")
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
    """Bootstrap: create accounts directly in the database (ISTHMUS_DATABASE_URL).

    For a running gateway use `isthmus admin accounts ...`; to see your own accounts,
    `isthmus accounts`.
    """


@account.command("create")
@click.argument("name")
@click.option("--parent", default=None, help="parent account (quotas and budgets are inherited from it)")
@click.option("--shares", default=1, show_default=True, type=int, help="fair-share shares among its siblings")
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
               ("assigned_backend", "POOL"), ("total_gpus", "GPUS"), ("created_at", "SUBMITTED"),
               ("estimated_start", "EST_START")]


def _job_detail(job: dict) -> str:
    keys = ["id", "name", "account", "user", "state", "state_reason", "estimated_start", "estimated_pool",
            "estimate_reason", "backend", "assigned_backend",
            "routing_reason", "command", "workers", "gpus_per_worker", "total_gpus", "cpus_per_worker",
            "memory_per_worker", "gpu_type", "time_limit", "priority", "backend_job_id", "nodes",
            "exit_code", "created_at", "started_at", "ended_at"]
    return "\n".join(f"{k + ':':18} {json.dumps(job[k]) if k == 'command' else fmt(job[k])}"
                     for k in keys if k in job)


JOB_STATES = ["pending", "dispatching", "queued", "starting", "running", "requeued", "cancelling",
              "succeeded", "failed", "cancelled"]
FINAL_STATES = ("succeeded", "failed", "cancelled")


@main.command()
@click.argument("file", type=click.File("r"))
@click.option("--idempotency-key", default=None, metavar="KEY",
              help="make the submission safe to retry: the same KEY and file give the same job "
                   "(reported as 'replayed'), never a second one")
@click.option("--quiet", "-q", is_flag=True, help="print only the job id (for scripts)")
@client_options
def submit(file, idempotency_key: str | None, quiet: bool, url: str, token: str | None, as_json: bool) -> None:
    """Submit a job from a YAML or JSON file ('-' for stdin)."""
    import yaml

    try:
        spec = yaml.safe_load(file)
    except yaml.YAMLError as exc:
        raise click.ClickException(f"cannot parse {file.name}: {exc}") from None
    if not isinstance(spec, dict):
        raise click.ClickException(f"{file.name}: expected a mapping with the job spec")
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    status, job = Client(url, token).request("POST", "/v1/jobs", json=spec, headers=headers)
    if quiet and not as_json:
        click.echo(job["id"])
        return
    # 200: the gateway had this Idempotency-Key already and answers with that job.
    verb = "replayed (same Idempotency-Key as before; no new job)" if status == 200 else "submitted"
    _emit(job, as_json, lambda j: f"{verb} job {j['id']} ({j['name']}), state {j['state']}: {j['state_reason']}")


@main.command()
@click.option("--state", multiple=True, type=click.Choice(JOB_STATES),
              help="only jobs in this state (repeatable)")
@click.option("--account", help="only jobs of this account")
@click.option("--backend", type=click.Choice(["auto", "slurm", "kubernetes"]),
              help="only jobs that asked for or were routed to this pool")
@click.option("--limit", default=50, show_default=True, type=int, help="jobs per page")
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
@click.option("--wait", is_flag=True,
              help="wait until the job ends; exit status 0 only if it succeeded")
@click.option("--timeout", default=3600, show_default=True, type=int, help="seconds --wait waits at most")
@client_options
def job(job_id, events, wait, timeout, url, token, as_json) -> None:
    """Show one job."""
    import time

    client = Client(url, token)
    data = client.call("GET", f"/v1/jobs/{job_id}")
    deadline = time.monotonic() + timeout
    while wait and data["state"] not in FINAL_STATES:
        if time.monotonic() > deadline:
            raise click.ClickException(f"job {job_id} still {data['state']} after {timeout} s: {data['state_reason']}")
        time.sleep(2)
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
    if wait and data["state"] != "succeeded":
        raise click.ClickException(f"job {job_id} {data['state']}: {data['state_reason']}")


@main.command()
@click.argument("job_id")
@client_options
def cancel(job_id, url, token, as_json) -> None:
    """Cancel a job."""
    data = Client(url, token).call("POST", f"/v1/jobs/{job_id}/cancel")
    _emit(data, as_json, lambda j: f"job {j['id']}: {j['state']}")


@main.command()
@client_options
def whoami(url, token, as_json) -> None:
    """What the gateway made of your token: user, POSIX user, accounts, admin, issuer."""
    data = Client(url, token).call("GET", "/v1/me")

    def render(me: dict) -> str:
        lines = [f"{'subject:':10} {me['subject']}", f"{'user:':10} {me['user'] or '- (no POSIX user)'}",
                 f"{'kind:':10} {me['kind']}", f"{'admin:':10} {fmt(me['admin'])}", f"{'issuer:':10} {me['issuer']}"]
        accts = [f"  {a['name']} ({a['role']}{'' if a['exists'] else ', not an account on this gateway'})"
                 for a in me["accounts"]]
        return "\n".join(lines + ["accounts:"] + (accts or ["  - (none: you cannot submit jobs)"]))

    _emit(data, as_json, render)


@main.command()
@client_options
def accounts(url, token, as_json) -> None:
    """Your accounts and their fair-share factor (admins: all accounts)."""
    data = Client(url, token).call("GET", "/v1/accounts")["items"]
    _emit(data, as_json, lambda rows: _table(
        [{**r, "fairshare_factor": None if r["fairshare_factor"] is None else f"{r['fairshare_factor']:.4f}"}
         for r in rows], [("name", "ACCOUNT"), ("parent", "PARENT"), ("shares", "SHARES"),
                          ("fairshare_factor", "FAIRSHARE"), ("description", "DESCRIPTION")]))


def inherited(limit: dict, account: str) -> str:
    """A quota value, marked with the account it comes from when that is not ``account``."""
    if limit.get("value") is None:
        return "-"
    source = limit.get("source")
    return fmt(limit["value"]) + ("" if source in (None, account) else f" (from {source})")


@main.command()
@click.argument("account")
@client_options
def usage(account, url, token, as_json) -> None:
    """An account's usage, remaining budget, quotas and fair share."""
    data = Client(url, token).call("GET", f"/v1/accounts/{account}/usage")

    def render(u: dict) -> str:
        budget_from = u["quota"]["budget_gpu_hours"].get("source")
        shared = "" if budget_from in (None, account) else f" (budget of {budget_from}, shared with its subaccounts)"
        lines = [f"account:            {u['account']}", f"period:             {fmt(u['period'])}",
                 f"used GPU-h:         {fmt(u['used_gpu_hours'])}{shared}",
                 f"committed GPU-h:    {fmt(u['committed_gpu_hours'])}",
                 f"remaining GPU-h:    {fmt(u['remaining_gpu_hours'])}{shared}",
                 f"GPUs in use:        {u['balance']['reserved_gpus']}", "quotas:"]
        for k, v in u["quota"].items():
            if isinstance(v, dict):
                lines.append(f"  {k:26} {inherited(v, account)}")
        if u.get("fairshare"):
            lines.append(f"fair-share factor:  {u['fairshare']['factor']:.4f}")
        return "\n".join(lines)

    _emit(data, as_json, render)


from gateway.admin.cli import admin as _admin  # noqa: E402  (after main exists)

main.add_command(_admin)  # `isthmus admin ...`


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
