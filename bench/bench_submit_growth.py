"""Submissions and reads as the registry grows (issue #32): an empty registry against one of
1,000,000 jobs with 10,000 of them pending, both against the bare FastAPI reference, in one run.

Usage: python bench/bench_submit_growth.py [--seconds 15] [--concurrency 32] [--repeats 3]
       [--jobs 1000000] [--pending 10000] [--label NAME] [--no-write]

Starts on loopback, on the benchmark Postgres (ISTHMUS_BENCH_POSTGRES_URL, else the test
stack's): the gateway (`isthmus serve`, uvicorn, 2 workers, dev issuer) and the bare app
(bench/bare_app.py, same server settings). The same compiled load generator (`hey`) drives
both. For each registry size it measures, `repeats` times, interleaved with the bare app:
- `POST /v1/jobs` from one user of one account, 32 closed-loop clients;
- `GET /v1/jobs?limit=50` (that user's newest jobs), the same with `state=succeeded` (the
  history's state: newest first, it must not sort the history) and `state=failed` (a state no
  job is in: it must not walk the history to find none), `GET /v1/jobs/{id}`,
  `GET /v1/jobs/{id}/events`, and the admin usage report `GET /v1/admin/usage`;
- the dashboard's pages (`/ui/`: the user's jobs, `/ui/jobs/{id}`, `/ui/accounts`, and
  `/ui/admin` as an admin), with a logged-in session made as the login callback makes it
  (a `ui_session` row holding the dev token, and the signed cookie naming it): the dashboard
  is server-rendered, so these are its reads.

The registry is grown in SQL, documented here and in docs/benchmarks.md: copies of one job
the API accepted (same spec, account team-a, user alice) with new time-ordered ids (UUIDv7-style,
as gateway/kit/timeutil.py makes them), 1 event each: history ended (succeeded), one job every
2 s before the last day; `pending` more left pending, made one every 50 ms before now. The "empty"
registry holds one page of that history (100 jobs) so that a list of it answers a full page in
both phases. Submissions are compared with the bare app within each repeat as well. The submit
caps are lifted (as bench/bench_api.py does) so the run measures their cost, not their 429s.
Writes docs/benchmarks.md, section "growth" (or "growth-LABEL").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

from sqlalchemy import create_engine, text

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_api import HEY, PG, SPEC, start
from bench.common import BIN, free_port, fresh_database, machine, median, write_section

UI_SECRET = "bench-ui-session-secret-0123456789abcdef"
HISTORY_PAGE = 100  # finished jobs in the "empty" registry: one page of the history's state
# Issue #46's goals: requests/s of the read over the bare endpoint's, at 1,000,000 jobs.
GOALS = {"list 50": 0.25, "one job": 0.25, "page: jobs": 0.1, "page: one job": 0.1, "page: accounts": 0.1,
         "page: admin": 0.1}


def hey(url: str, token: str, *, seconds: float, concurrency: int, post: bool) -> dict:
    """``token``: a bearer token, or ``Cookie: ...`` for a dashboard page."""
    header = token if token.startswith("Cookie: ") else f"Authorization: Bearer {token}"
    cmd = [HEY, "-z", f"{seconds:g}s", "-c", str(concurrency), "-H", header]
    if post:
        cmd += ["-m", "POST", "-T", "application/json", "-d", json.dumps(SPEC)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {int(m.group(1)): float(m.group(2)) * 1e3 for m in re.finditer(r"(\d+)%+ in ([\d.]+) secs", out)}
    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    ok = sum(n for c, n in codes.items() if 200 <= c < 300)
    # The load generator's own CPU per request (it shares the 2 cores with the servers).
    client_ms = client_s / max(1, sum(codes.values())) * 1e3
    return {"rps": rps, "p50": lat.get(50, float("nan")), "p99": lat.get(99, float("nan")),
            "errors": sum(codes.values()) - ok, "client_ms": client_ms}


# Columns a copied job takes from its template; the rest are set by the growth SQL.
_SET = {"id", "state", "created_at", "updated_at", "started_at", "ended_at", "state_reason"}


def grow(url_db: str, template: str, *, history: int, pending: int) -> float:
    """Grow the registry in SQL (documented in the module docstring); returns seconds taken."""
    t0 = time.monotonic()
    eng = create_engine(url_db)
    with eng.begin() as c:
        cols = [r[0] for r in c.execute(text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'job' "
            "AND table_schema = current_schema() ORDER BY ordinal_position"))]
        kept = [col for col in cols if col not in _SET]
        names = ", ".join(kept + ["id", "state", "created_at", "updated_at", "started_at", "ended_at", "state_reason"])
        copied = ", ".join(f"t.{col}" for col in kept)
        # History: one job every 2 s back from a day ago; pending: one every 50 ms before now.
        # Ids as the gateway makes them (UUIDv7-style, gateway/kit/timeutil.py new_ids): time-ordered.
        for state, n, ended, when in (("succeeded", history, True, "now() - interval '1 day' - g * interval '2 seconds'"),
                                      ("pending", pending, False, "now() - g * interval '50 milliseconds'")):
            if n <= 0:
                continue
            ms = f"lpad(to_hex((extract(epoch FROM {when}) * 1000)::bigint), 12, '0')"
            rnd = "md5(g::text || :state)"
            uid = (f"substr({ms}, 1, 8) || '-' || substr({ms}, 9, 4) || '-7' || lpad(to_hex(g % 4096), 3, '0') || '-8' "
                   f"|| substr({rnd}, 1, 3) || '-' || substr({rnd}, 4, 12)")
            c.execute(text(
                f"INSERT INTO job ({names}) SELECT {copied}, {uid}, :state, {when}, {when}, "
                f"{when + ' + interval ' + chr(39) + '1 minute' + chr(39) if ended else 'NULL'}, "
                f"{when + ' + interval ' + chr(39) + '1 hour' + chr(39) if ended else 'NULL'}, 'bench growth' "
                f"FROM job t, generate_series(1, :n) g WHERE t.id = :template"),
                {"state": state, "n": n, "template": template})
        c.execute(text(
            "INSERT INTO job_event (job_id, at, actor, kind, from_state, to_state, reason) "
            "SELECT id, created_at, 'bench', 'state', NULL, state, 'bench growth' FROM job "
            "WHERE state_reason = 'bench growth' AND NOT EXISTS (SELECT 1 FROM job_event e WHERE e.job_id = job.id)"))
    with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE"))
    eng.dispose()
    return time.monotonic() - t0


def registry(url_db: str) -> tuple[int, int]:
    eng = create_engine(url_db)
    with eng.connect() as c:
        total = c.execute(text("SELECT count(*) FROM job")).scalar()
        waiting = c.execute(text("SELECT count(*) FROM job WHERE state = 'pending'")).scalar()
    eng.dispose()
    return total, waiting


def dev_tokens(env: dict[str, str]) -> tuple[str, str]:
    """Tokens from the dev issuer ``env`` names: alice's (account team-a) and an admin's."""
    def token(*a: str) -> str:
        return subprocess.run([str(BIN / "isthmus"), "token", *a, "--lifetime", "7200"], env=env, check=True,
                              capture_output=True, text=True).stdout.strip()
    return token("--user", "alice", "--groups", "team-a"), token("--user", "root-admin", "--admin")


def ui_cookie(url_db: str, token: str, subject: str) -> str:
    """A logged-in dashboard session as the login callback makes one (gateway/identity/ui_sessions.py):
    its row, holding the access token, and the signed cookie naming it."""
    from base64 import b64encode

    import itsdangerous

    from gateway.identity import ui_sessions
    from gateway.kit.db import make_engine, make_sessionmaker, transaction
    from gateway.ui.session import COOKIE

    engine = make_engine(url_db)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            sid = ui_sessions.create(session, access_token=token, subject=subject, token_expires_at=None)
    finally:
        engine.dispose()
    signer = itsdangerous.TimestampSigner(UI_SECRET, salt="isthmus-ui-session")
    value = signer.sign(b64encode(json.dumps({"sid": sid}).encode())).decode()
    return f"Cookie: {COOKIE}={value}"


def measure(args, url_db: str) -> tuple[dict[str, dict], float, tuple[int, int]]:
    """Both registry sizes against the servers on ``url_db`` (a migrated, empty database)."""
    key = f"{url_db.rsplit('/', 1)[1]}-dev.pem"
    env = {**os.environ, "ISTHMUS_DATABASE_URL": url_db, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": f"/tmp/{key}",
           "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_UI_SESSION_SECRET": UI_SECRET,
           "ISTHMUS_MAX_PENDING_JOBS_PER_USER": "10000000", "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT": "10000000"}

    user, adm = dev_tokens(env)
    gport, bport, hport = free_port(), free_port(), free_port()
    # The reference runs with the gateway's server settings (gateway/cli.py serve: h11, whose
    # header-size limit the gateway needs, docs/security.md finding 5; keep-alive 5 s). The
    # same app on uvicorn's default parser (httptools) is shown beside it, as bench_api.py runs it.
    bare_cmd = [str(BIN / "uvicorn"), "bench.bare_app:app", "--workers", str(args.workers),
                "--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "5"]
    servers = []
    sizes: dict[str, dict] = {}
    grow_s = 0.0
    grown_at = (0, 0)
    try:
        servers.append(start([str(BIN / "isthmus"), "serve", "--dev", "--port", str(gport), "--workers",
                              str(args.workers)], env, gport))
        servers.append(start(bare_cmd + ["--port", str(bport), "--http", "h11"], env, bport))
        servers.append(start(bare_cmd + ["--port", str(hport)], env, hport))
        g, b, h = f"http://127.0.0.1:{gport}", f"http://127.0.0.1:{bport}", f"http://127.0.0.1:{hport}"
        import httpx
        first = httpx.post(g + "/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {user}"}, timeout=30)
        first.raise_for_status()
        job = first.json()["id"]
        for u in (g, b, h):  # warm-up
            hey(u + "/v1/jobs", user, seconds=2, concurrency=8, post=True)
        reads = {"list 50": (f"{g}/v1/jobs?limit=50", user),
                 "list 50 succeeded": (f"{g}/v1/jobs?limit=50&state=succeeded", user),
                 "list 50 failed": (f"{g}/v1/jobs?limit=50&state=failed", user), "one job": (f"{g}/v1/jobs/{job}", user),
                 "events": (f"{g}/v1/jobs/{job}/events", user), "usage report": (f"{g}/v1/admin/usage", adm)}
        user_ui, adm_ui = ui_cookie(url_db, user, "alice"), ui_cookie(url_db, adm, "root-admin")
        reads.update({"page: jobs": (f"{g}/ui/", user_ui), "page: one job": (f"{g}/ui/jobs/{job}", user_ui),
                      "page: accounts": (f"{g}/ui/accounts", user_ui), "page: admin": (f"{g}/ui/admin", adm_ui)})
        for name, (u, tok) in reads.items():  # every read answers 200 before it is measured
            header = tok.split(": ", 1) if tok.startswith("Cookie: ") else ("Authorization", f"Bearer {tok}")
            r = httpx.get(u, headers={header[0]: header[1]}, timeout=30, follow_redirects=False)
            if r.status_code != 200:
                raise SystemExit(f"{name}: {u} answered {r.status_code}: {r.text[:300]}")
        # "Empty" holds one page of history, so that the list of the history's state answers a
        # full page in both phases (an empty page costs less to encode than 50 jobs).
        grow(url_db, job, history=HISTORY_PAGE, pending=0)
        for phase in ("empty", "grown"):
            if phase == "grown":
                total, waiting = registry(url_db)
                more = max(0, args.pending - waiting)
                grow_s = grow(url_db, job, history=max(0, args.jobs - total - more), pending=more)
                grown_at = registry(url_db)
            res: dict[str, list[dict]] = {}
            for _ in range(args.repeats):
                for name, (u, tok, post, secs) in {"submit": (g + "/v1/jobs", user, True, args.seconds),
                                                   "bare": (b + "/v1/jobs", user, True, args.seconds),
                                                   "bare httptools": (h + "/v1/jobs", user, True, args.seconds),
                                                   **{k: (u, t, False, args.read_seconds) for k, (u, t) in reads.items()},
                                                   "bare again": (b + "/v1/jobs", user, True, args.seconds),
                                                   }.items():
                    r = hey(u, tok, seconds=secs, concurrency=args.concurrency, post=post)
                    res.setdefault(name, []).append(r)
                    print(f"{phase:5} {name:12} {r['rps']:7.1f} req/s p50 {r['p50']:7.1f} ms p99 {r['p99']:7.1f} ms "
                          f"errors {r['errors']} client CPU {r['client_ms']:.3f} ms/request", flush=True)
            total, waiting = registry(url_db)
            sizes[phase] = {"total": total, "pending": waiting,
                            # gateway / bare within each repeat (same minute, same host load)
                            "submit/bare": median([s["rps"] / b["rps"] for s, b in zip(res["submit"], res["bare"], strict=True)]),
                            # each read against the bare endpoint of its own repeat, taken before and
                            # after the reads (their mean: the host's drift within a repeat cancels)
                            "read/bare": {k: median([x["rps"] / ((b1["rps"] + b2["rps"]) / 2) for x, b1, b2 in
                                                     zip(res[k], res["bare"], res["bare again"], strict=True)])
                                          for k in reads},
                            **{k: {m: median([x[m] for x in v]) for m in ("rps", "p50", "p99", "errors", "client_ms")}
                               for k, v in res.items()}}
    finally:
        for p in servers:
            p.terminate()
            p.wait(10)
        if os.path.exists(f"/tmp/{key}"):
            os.remove(f"/tmp/{key}")
    return sizes, grow_s, grown_at


def _goal(read: str, ratio: float) -> str:
    if read not in GOALS:
        return ""
    return f">= {GOALS[read]}: {'met' if ratio >= GOALS[read] else 'not met'}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--read-seconds", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--label", default="")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    with fresh_database(PG, migrated=True) as url_db:
        sizes, grow_s, grown_at = measure(args, url_db)

    e, r = sizes["empty"], sizes["grown"]
    rows = []
    for k in ("submit", "list 50", "list 50 succeeded", "list 50 failed", "one job", "events", "usage report",
              "page: jobs", "page: one job", "page: accounts", "page: admin"):
        what = "`POST /v1/jobs`" if k == "submit" else k
        rows.append(f"| {what} | {e[k]['rps']:.0f} | {e[k]['p50']:.1f} / {e[k]['p99']:.1f} | {r[k]['rps']:.0f} | "
                    f"{r[k]['p50']:.1f} / {r[k]['p99']:.1f} | {r[k]['rps'] / e[k]['rps']:.2f} |")
    ratio_e, ratio_g = e["submit"]["rps"] / e["bare"]["rps"], r["submit"]["rps"] / r["bare"]["rps"]
    label = f" ({args.label})" if args.label else ""
    body = f"""## Submissions and reads as the registry grows{label} (issue #32)

`python bench/bench_submit_growth.py --seconds {args.seconds:g} --concurrency {args.concurrency} --repeats {args.repeats} --jobs {args.jobs} --pending {args.pending}`
({machine()}; uvicorn with {args.workers} workers for both servers; `hey` on the same machine; medians of {args.repeats}
repeats, each {args.seconds:g} s for submissions and {args.read_seconds:g} s for reads, {args.concurrency} closed-loop clients;
run {time.strftime('%Y-%m-%d')}; load average at the end {os.getloadavg()[0]:.1f}). Registry: empty = {e['total']:,} jobs
({e['pending']:,} pending, {HISTORY_PAGE} finished: one page of history) at the end of its measurements; grown = {grown_at[0]:,} jobs ({grown_at[1]:,} pending) when its measurements began and
{r['total']:,} ({r['pending']:,} pending) at their end, grown in SQL in {grow_s:.0f} s (copies of one accepted job with time-ordered ids as the gateway makes them, one event
each; history ended one every 2 s before the last day, pending made over the last minutes; see the module docstring). One user (alice, account team-a) submits and reads; its own history is the
registry, the worst case for its lists. Spread between repeats is in the log the run prints.

| | gateway submit | bare FastAPI, the gateway's server settings (h11) | gateway / bare | bare FastAPI on httptools | gateway / bare on httptools |
|---|---|---|---|---|---|
| empty: requests/s | {e['submit']['rps']:.0f} | {e['bare']['rps']:.0f} | **{ratio_e:.3f}** | {e['bare httptools']['rps']:.0f} | {e['submit']['rps'] / e['bare httptools']['rps']:.3f} |
| empty: p50 / p99 (ms) | {e['submit']['p50']:.1f} / {e['submit']['p99']:.1f} | {e['bare']['p50']:.1f} / {e['bare']['p99']:.1f} | | {e['bare httptools']['p50']:.1f} / {e['bare httptools']['p99']:.1f} | |
| grown: requests/s | {r['submit']['rps']:.0f} | {r['bare']['rps']:.0f} | **{ratio_g:.3f}** | {r['bare httptools']['rps']:.0f} | {r['submit']['rps'] / r['bare httptools']['rps']:.3f} |
| grown: p50 / p99 (ms) | {r['submit']['p50']:.1f} / {r['submit']['p99']:.1f} | {r['bare']['p50']:.1f} / {r['bare']['p99']:.1f} | | {r['bare httptools']['p50']:.1f} / {r['bare httptools']['p99']:.1f} | |
| errors (non-2xx), empty / grown | {e['submit']['errors']:.0f} / {r['submit']['errors']:.0f} | | | | |

Submissions, grown against empty: **{r['submit']['rps'] / e['submit']['rps']:.2f}** (goal >= 0.9); the same of gateway / bare taken
within each repeat (median of the repeats), which takes out the host's drift between the phases:
**{r['submit/bare'] / e['submit/bare']:.2f}** ({e['submit/bare']:.3f} empty, {r['submit/bare']:.3f} grown). Gateway / bare with the same
server settings: {ratio_e:.3f} empty, {ratio_g:.3f} grown (goal >= 0.25 with p99 <= 100 ms).

| request | empty: req/s | empty: p50 / p99 (ms) | grown: req/s | grown: p50 / p99 (ms) | grown / empty |
|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n" + f"""
Reads against the bare endpoint (issue #46: at {grown_at[0]:,} jobs, a list of 50 and one job >= 0.25, each
page >= 0.1): each read's requests/s over the bare endpoint's of the same repeat, measured before and
after the reads (their mean), median of the repeats; the load generator's own CPU per request
(`hey`, on the same 2 cores; the bare endpoint's: {e['bare']['client_ms']:.3f} ms empty, {r['bare']['client_ms']:.3f} ms grown).

| read | empty: / bare | grown: / bare | goal | client CPU ms/request (grown) |
|---|---|---|---|---|
""" + "\n".join(
        f"| {k} | {e['read/bare'][k]:.3f} | **{r['read/bare'][k]:.3f}** | "
        f"{_goal(k, r['read/bare'][k])} | "
        f"{r[k]['client_ms']:.3f} |" for k in e['read/bare']) + "\n"
    print(body)
    if not args.no_write:
        write_section("growth" + (f"-{args.label}" if args.label else ""), body)


if __name__ == "__main__":
    main()
