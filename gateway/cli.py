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
def worker(once: bool) -> None:
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
    signal.signal(signal.SIGTERM, lambda *_: dispatcher.request_stop())
    click.echo(f"worker: dispatching to {', '.join(sorted(backends))}", err=True)
    webhooks.start()
    try:
        dispatcher.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
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
    from gateway.accounts.service import exists
    from gateway.admin import lifecycle
    from gateway.kit.db import make_engine, make_sessionmaker, transaction
    from gateway.kit.errors import GatewayError

    settings = _settings()
    engine = make_engine(settings.database_url)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            if exists(session, name):
                click.echo(f"account {name} exists")
                return
            lifecycle.create(session, name=name, parent_name=parent, shares=shares)
            click.echo(f"created account {name}")
    except GatewayError as exc:  # a bad name, an unknown parent, a tree too deep: the API's words
        raise click.ClickException(str(exc)) from None
    finally:
        engine.dispose()


# ----------------------------------------------------------------- client side


JOB_COLUMNS = [("id", "ID"), ("name", "NAME"), ("account", "ACCOUNT"), ("user", "USER"), ("state", "STATE"),
               ("assigned_pool", "POOL"), ("total_gpus", "GPUS"), ("created_at", "SUBMITTED"),
               ("estimated_start", "EST_START")]


TASK_COLUMNS = [("array_index", "INDEX"), ("id", "ID"), ("state", "STATE"), ("assigned_backend", "POOL"),
                ("parameters", "PARAMETERS"), ("state_reason", "REASON")]


def _job_detail(job: dict) -> str:
    keys = ["id", "name", "account", "user", "state", "state_reason", "estimated_start", "estimated_pool",
            "estimate_reason", "pool", "pool_kind", "assigned_pool",
            "routing_reason", "command", "workers", "gpus_per_worker", "total_gpus", "cpus_per_worker",
            "memory_per_worker", "gpu_type", "time_limit", "priority", "backend_job_id", "nodes",
            "exit_code", "created_at", "started_at", "ended_at", "job_set_id", "array_index", "parameters",
            "depends_on", "dependents", "checkpoint_dir"]
    lines = [f"{k + ':':18} {json.dumps(job[k]) if k in JSON_KEYS else fmt(job[k])}"
             for k in keys if k in job and (job[k] is not None or k not in OPTIONAL_KEYS)]
    if job.get("attempts"):  # the attempts that ended and were retried (docs/recovery.md)
        lines.append(f"{'attempt:':18} {job.get('attempt')}")
        for a in job["attempts"]:
            ran = f"{fmt(a['started_at'])} to {fmt(a['ended_at'])}" if a.get("started_at") else "never started"
            lines.append(f"  attempt {a['number']}: {a['outcome']} on {a.get('pool') or '-'} "
                         f"({','.join(a.get('nodes') or []) or '-'}), {ran}, {a['charged_gpu_hours']:.4f} GPU-h: "
                         f"{a['reason']}")
    return "\n".join(lines)


JSON_KEYS = ("command", "parameters", "depends_on", "dependents")
OPTIONAL_KEYS = ("job_set_id", "array_index", "parameters", "depends_on", "dependents", "checkpoint_dir")


JOB_STATES = ["blocked", "pending", "dispatching", "queued", "starting", "running", "requeued", "cancelling",
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
    """Submit a job, an array or sweep, or a pipeline, from a YAML or JSON file ('-' for stdin).

    A mapping with `array` or `sweep` is submitted as a job set; a mapping with `steps`
    is a pipeline whose steps refer to earlier ones by name (docs/jobs.md, "Pipelines").
    """
    import yaml

    try:
        spec = yaml.safe_load(file)
    except yaml.YAMLError as exc:
        raise click.ClickException(f"cannot parse {file.name}: {exc}") from None
    if not isinstance(spec, dict):
        raise click.ClickException(f"{file.name}: expected a mapping with the job spec")
    client = Client(url, token)
    if "steps" in spec:
        if idempotency_key:
            raise click.ClickException("--idempotency-key applies to one job, not to a pipeline")
        submitted = submit_pipeline(client, spec, source=file.name)
        if quiet and not as_json:
            click.echo("\n".join(s["id"] for s in submitted.values()))
            return
        _emit(list(submitted.values()), as_json, lambda rows: _table(rows, STEP_COLUMNS))
        return
    if "array" in spec or "sweep" in spec:
        if idempotency_key:
            raise click.ClickException("--idempotency-key applies to one job, not to an array or sweep")
        job_set = client.call("POST", "/v1/job-sets", json=spec)
        if quiet and not as_json:
            click.echo(job_set["id"])
            return
        _emit(job_set, as_json, lambda s: f"submitted job set {s['id']} ({s['name']}): {s['task_count']} tasks "
                                          f"({', '.join(f'{n} {st}' for st, n in sorted(s['counts'].items()))}); "
                                          f"list them with: isthmus jobs --set {s['id']}")
        return
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    status, job = client.request("POST", "/v1/jobs", json=spec, headers=headers)
    if quiet and not as_json:
        click.echo(job["id"])
        return
    # 200: the gateway had this Idempotency-Key already and answers with that job.
    verb = "replayed (same Idempotency-Key as before; no new job)" if status == 200 else "submitted"
    _emit(job, as_json, lambda j: f"{verb} job {j['id']} ({j['name']}), state {j['state']}: {j['state_reason']}")


STEP_COLUMNS = [("step", "STEP"), ("kind", "KIND"), ("id", "ID"), ("state", "STATE"), ("depends_on", "WAITS FOR")]


def submit_pipeline(client: Client, pipeline: dict, *, source: str) -> dict[str, dict]:
    """Submit ``steps`` in file order; ``depends_on: [{step: NAME}]`` names an earlier step.

    Steps are sent one by one: if one is refused, the earlier ones stay submitted (they are
    listed in the error) and can be cancelled with ``isthmus cancel --cascade`` on the first.
    """
    steps = pipeline.get("steps")
    defaults = pipeline.get("defaults") or {}
    unknown = set(pipeline) - {"steps", "defaults"}
    if unknown:
        raise click.ClickException(f"{source}: a pipeline has only 'defaults' and 'steps', not {sorted(unknown)}")
    if not isinstance(steps, list) or not steps or not isinstance(defaults, dict):
        raise click.ClickException(f"{source}: 'steps' must be a non-empty list and 'defaults' a mapping")
    done: dict[str, dict] = {}
    for i, raw in enumerate(steps):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise click.ClickException(f"{source}: steps[{i}] must be a mapping with a name")
        name = raw["name"]
        if name in done:
            raise click.ClickException(f"{source}: steps[{i}]: a step named {name!r} is already defined")
        spec = {**defaults, **raw}
        deps = []
        for j, dep in enumerate(spec.get("depends_on") or []):
            if isinstance(dep, dict) and "step" in dep:
                target = done.get(dep["step"])
                if target is None:
                    raise click.ClickException(
                        f"{source}: steps[{i}].depends_on[{j}]: no step {dep['step']!r} before {name!r} "
                        f"(a step can only wait for an earlier one)")
                key = "job_set" if target["kind"] != "job" else "job"
                deps.append({key: target["id"], **{k: v for k, v in dep.items() if k != "step"}})
            else:
                deps.append(dep)
        if deps:
            spec["depends_on"] = deps
        is_set = "array" in spec or "sweep" in spec
        try:
            out = client.call("POST", "/v1/job-sets" if is_set else "/v1/jobs", json=spec)
        except click.ClickException as exc:
            sent = ", ".join(f"{n}={s['id']}" for n, s in done.items()) or "none"
            raise click.ClickException(f"step {name!r}: {exc.message} (already submitted: {sent})") from None
        done[name] = {"step": name, "kind": ("array" if "array" in spec and "sweep" not in spec else "sweep")
                      if is_set else "job", "id": out["id"],
                      "state": out.get("state") or ", ".join(f"{n} {st}" for st, n in sorted(out["counts"].items())),
                      "depends_on": ", ".join(d.get("step", "") or "" for d in raw.get("depends_on") or [])}
    return done


@main.command()
@click.option("--state", multiple=True, type=click.Choice(JOB_STATES),
              help="only jobs in this state (repeatable)")
@click.option("--account", help="only jobs of this account")
@click.option("--pool", "pool", help="only jobs that asked for or were routed to this pool (isthmus pools)")
@click.option("--backend", "pool", hidden=True, help="deprecated: --pool")
@click.option("--limit", default=50, show_default=True, type=int, help="jobs per page")
@click.option("--all", "all_pages", is_flag=True, help="follow every page")
@click.option("--set", "job_set", metavar="ID", help="only the tasks of this array or sweep, in index order")
@client_options
def jobs(state, account, pool, limit, all_pages, job_set, url, token, as_json) -> None:
    """List jobs you can see, newest first (a set's tasks: in index order)."""
    client = Client(url, token)
    params: dict[str, Any] = {"limit": limit}
    if job_set:
        if account or pool:
            raise click.ClickException("--set lists one set's tasks; it does not combine with --account/--pool")
        if state:
            params["state"] = list(state)
        items = []
        while True:
            page = client.call("GET", f"/v1/job-sets/{job_set}/tasks", params=params)
            items.extend(page["items"])
            if not (all_pages and page["next_cursor"]):
                break
            params["cursor"] = page["next_cursor"]
        _emit(items, as_json, lambda rows: _table(rows, TASK_COLUMNS))
        return
    if state:
        params["state"] = list(state)
    if account:
        params["account"] = account
    if pool:
        params["pool"] = pool
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
@click.option("--watch", is_flag=True,
              help="print the job's events live (server-sent events) until it ends; exit status 0 only if it succeeded")
@client_options
def job(job_id, events, wait, timeout, watch, url, token, as_json) -> None:
    """Show one job."""
    import time

    client = Client(url, token)
    if watch:
        _watch_job(client, job_id, timeout, as_json)
        return
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


def _event_line(e: dict) -> str:
    change = f"{e['from_state'] or '-'} -> {e['to_state']}" if e.get("to_state") else e["kind"]
    return f"{e['at']}  {change}  {e.get('reason') or ''}".rstrip()


def _watch_job(client: Client, job_id: str, timeout: int, as_json: bool) -> None:
    """The job's history so far, then its events as they happen (GET /v1/events/stream)."""
    import time

    import httpx

    history = client.call("GET", f"/v1/jobs/{job_id}/events")["items"]
    last = 0
    state = None
    for e in history:
        click.echo(json.dumps(e) if as_json else _event_line(e))
        last, state = e["id"], e.get("to_state") or state
    deadline = time.monotonic() + timeout
    while state not in FINAL_STATES:
        if time.monotonic() > deadline:
            raise click.ClickException(f"job {job_id} still {state} after {timeout} s")
        try:
            # Resumes after the last event seen: a dropped connection loses nothing.
            with client.http.stream("GET", "/v1/events/stream", headers={"Last-Event-ID": str(last)},
                                    timeout=httpx.Timeout(30, read=120)) as r:
                if r.status_code >= 400:
                    r.read()
                    raise click.ClickException(f"{r.status_code}: {r.text[:500]}")
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    e = json.loads(line[6:])
                    last = e["id"]
                    if e["job_id"] != job_id:
                        continue
                    click.echo(json.dumps(e) if as_json else _event_line(e))
                    state = e.get("to_state") or state
                    if state in FINAL_STATES or time.monotonic() > deadline:
                        break
        except httpx.HTTPError:
            time.sleep(1)  # reconnect with Last-Event-ID
    if state != "succeeded":
        raise click.ClickException(f"job {job_id} {state}")


@main.command()
@click.argument("job_id")
@click.option("--worker", "-w", default=0, show_default=True, type=int, help="worker index (0 to workers-1)")
@click.option("--tail", default=None, type=int, metavar="N", help="only the last N lines")
@click.option("--follow", "-f", is_flag=True, help="keep printing new output until the job ends")
@client_options
def logs(job_id, worker, tail, follow, url, token, as_json) -> None:
    """Print a job's output (stdout and stderr) for one worker."""
    import httpx

    client = Client(url, token)
    params: dict[str, Any] = {"worker": worker, "follow": "true" if follow else "false"}
    if tail is not None:
        params["tail"] = tail
    out = click.get_binary_stream("stdout")
    try:
        with client.http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params,
                                timeout=httpx.Timeout(30, read=None if follow else 30)) as r:
            if r.status_code >= 400:
                r.read()
                try:
                    p = r.json()
                    msg = f"{p.get('status')} {p.get('title')}: {p.get('detail') or ''}"
                except ValueError:
                    msg = f"{r.status_code}: {r.text[:500]}"
                raise click.ClickException(msg)
            for chunk in r.iter_raw():
                out.write(chunk)
                out.flush()
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the gateway: {exc}") from None


@main.command()
@click.argument("job_id")
@click.option("--cascade", is_flag=True, help="also cancel every job waiting for it")
@click.option("--set", "is_set", is_flag=True, help="the id is a job set: cancel all its tasks")
@client_options
def cancel(job_id, cascade, is_set, url, token, as_json) -> None:
    """Cancel a job (or, with --set, every task of a job set)."""
    if is_set:
        data = Client(url, token).call("POST", f"/v1/job-sets/{job_id}/cancel")
        _emit(data, as_json, lambda s: f"job set {s['id']}: " + ", ".join(f"{n} {st}" for st, n in
                                                                           sorted(s["counts"].items())))
        return
    data = Client(url, token).call("POST", f"/v1/jobs/{job_id}/cancel", params={"cascade": "true"} if cascade else None)
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


POOLS_COLUMNS = [("name", "POOL"), ("kind", "KIND"), ("state", "STATE"), ("health", "HEALTH"),
                 ("gpu_types", "GPU_TYPES"), ("gpus", "FREE/TOTAL_GPUS"), ("queue_depth", "QUEUED"),
                 ("cost", "COST"), ("domains", "DOMAINS"), ("reason", "REASON")]


@main.command()
@client_options
def pools(url, token, as_json) -> None:
    """The gateway's pools: kind, state, health, GPU types, capacity now, queue depth and network domains."""
    from gateway.domain.routing import topology_words

    data = Client(url, token).call("GET", "/v1/pools")

    def render(d: dict) -> str:
        if not d["items"]:
            return d["note"]
        return _table([{**p, "health": "ok" if p["healthy"] else "UNAVAILABLE",
                        "gpu_types": ",".join(p["gpu_types"]) or "-", "gpus": f"{p['free_gpus']}/{p['total_gpus']}",
                        "domains": topology_words((d["level"], d["name"], d["idle_nodes"], len(d["nodes"]))
                                                  for d in p.get("topology") or []) or "-"}
                       for p in d["items"]], POOLS_COLUMNS)

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

from gateway.cli_login import register as _register_login  # noqa: E402

_register_login(main)  # `isthmus login`, `isthmus logout`


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
