"""The user side of ``isthmus``: submit, jobs, job, logs, cancel, whoami, pools, accounts,
usage. Each only talks to a running gateway through its API (``cli_client.py``); cut out of
``cli.py`` (issue #46), which keeps the commands that run the gateway (serve, worker, migrate,
token, openapi, the bootstrap ``account create``) and composes the rest."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from gateway.cli_client import Client, _emit, _table, client_options, fmt

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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


COMMANDS = (submit, jobs, job, logs, cancel, whoami, pools, accounts, usage)
