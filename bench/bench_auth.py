"""Cost of bearer-token validation per request, with the provider's keys cached.

Usage: python bench/bench_auth.py [--seconds 5] [--repeats 3] [--issuer auto|keycloak|dev] [--no-write]

One gateway process (uvicorn on loopback, 1 worker) serves two endpoints that differ
only in authentication: ``GET /healthz`` (public) and ``GET /bench/whoami`` (the
``get_principal`` dependency, returning the caller's subject; no database). A single
keep-alive client alternates between them in rounds, so both see the same machine
noise. The token comes from the local Keycloak (``.stack/oidc/env``, RS256) when it is
up, else from the development issuer (also RS256 2048). The in-process cost of
``Authenticator.authenticate`` alone is measured too. Writes the section "auth" of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import (
    BIN,
    REPO,
    free_port,
    machine,
    median,
    pct,
    wait_ready,
    write_section,
)

ENV_FILE = REPO / ".stack" / "oidc" / "env"


def make_app():
    """uvicorn factory: the real gateway app plus one authenticated route without DB work."""
    from fastapi import Depends

    from gateway.app import create_app
    from gateway.identity.dependency import get_principal
    from gateway.identity.principal import Principal

    app = create_app()

    @app.get("/bench/whoami")
    def whoami(principal: Principal = Depends(get_principal)) -> dict:
        return {"sub": principal.subject}

    return app


def _keycloak_env() -> dict[str, str] | None:
    if not ENV_FILE.exists():
        return None
    env = dict(line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line and line[0] != "#")
    try:
        httpx.get(env["OIDC_ISSUER"] + "/.well-known/openid-configuration", timeout=3).raise_for_status()
    except httpx.HTTPError:
        return None
    return env


def _setup(kind: str, workdir: Path) -> tuple[dict[str, str], str, str]:
    """Server environment, a token, and a description of where it came from."""
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
    server_env.update(ISTHMUS_DATABASE_URL=f"sqlite:///{workdir}/bench.db", ISTHMUS_LOG_LEVEL="warning",
                      ISTHMUS_DEV_KEY_PATH=str(workdir / "dev-key.pem"), ISTHMUS_METRICS_TOKEN="bench-metrics-token")
    kc = _keycloak_env() if kind in ("auto", "keycloak") else None
    if kind == "keycloak" and kc is None:
        sys.exit("bench_auth: --issuer keycloak but stack/oidc is not up (bash stack/oidc/up.sh)")
    if kc:
        server_env["ISTHMUS_OIDC_ISSUERS"] = json.dumps([{"issuer": kc["OIDC_ISSUER"], "algorithms": ["RS256"]}])
        r = httpx.post(kc["OIDC_TOKEN_ENDPOINT"], data={
            "grant_type": "password", "client_id": kc["OIDC_CLIENT_ID"], "username": "alice",
            "password": "alice" + kc["OIDC_PASSWORD_SUFFIX"]}, timeout=30)
        r.raise_for_status()
        return server_env, r.json()["access_token"], f"Keycloak {kc['OIDC_PROVIDER_VERSION']} access token (RS256)"
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    server_env["ISTHMUS_DEV_MODE"] = "true"
    dev = build_dev_issuer(Settings(dev_key_path=workdir / "dev-key.pem"))
    return server_env, dev.mint(user="alice", groups=["team-a"], lifetime_s=3600), "dev-issuer token (RS256)"


def _loop(client: httpx.Client, path: str, headers: dict, seconds: float) -> tuple[list[float], int, float]:
    lat: list[float] = []
    errors = 0
    t0 = time.perf_counter()
    stop = t0 + seconds
    while (t := time.perf_counter()) < stop:
        r = client.get(path, headers=headers)
        lat.append((time.perf_counter() - t) * 1000)
        errors += r.status_code != 200
    return lat, errors, time.perf_counter() - t0


def _in_process(server_env: dict[str, str], token: str, n: int = 2000) -> float:
    """Median microseconds of Authenticator.authenticate alone (keys cached)."""
    from gateway.identity.setup import build_authenticator
    from gateway.kit.settings import Settings

    settings = Settings(**{k[len("ISTHMUS_"):].lower(): v for k, v in server_env.items() if k.startswith("ISTHMUS_")})
    auth = build_authenticator(settings)
    for _ in range(100):
        auth.authenticate(token)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        auth.authenticate(token)
        samples.append((time.perf_counter() - t) * 1e6)
    return median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5, help="per endpoint per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--issuer", choices=["auto", "keycloak", "dev"], default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server_env, token, source = _setup(args.issuer, workdir)
        subprocess.run([str(BIN / "isthmus"), "migrate"], env=server_env, check=True, capture_output=True)
        port = free_port()
        proc = subprocess.Popen(
            [str(BIN / "uvicorn"), "bench.bench_auth:make_app", "--factory", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--log-level", "warning", "--no-access-log"],
            cwd=REPO, env=server_env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + "/healthz", proc)
            auth_headers = {"Authorization": f"Bearer {token}"}
            results: dict[str, dict[str, list]] = {k: {"lat": [], "rps": [], "err": []} for k in ("bare", "auth")}
            with httpx.Client(base_url=url, timeout=10) as client:
                assert client.get("/bench/whoami", headers=auth_headers).status_code == 200
                _loop(client, "/healthz", {}, 1)  # warm-up
                _loop(client, "/bench/whoami", auth_headers, 1)
                for _ in range(args.repeats):
                    for kind, path, headers in (("bare", "/healthz", {}), ("auth", "/bench/whoami", auth_headers)):
                        lat, err, elapsed = _loop(client, path, headers, args.seconds)
                        results[kind]["lat"].append(lat)
                        results[kind]["rps"].append(len(lat) / elapsed)
                        results[kind]["err"].append(err)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        authenticate_us = _in_process(server_env, token)

    def fig(kind):
        r = results[kind]
        return (median([median(x) for x in r["lat"]]), median([pct(x, 99) for x in r["lat"]]),
                median(r["rps"]), sum(r["err"]))

    b50, b99, brps, berr = fig("bare")
    a50, a99, arps, aerr = fig("auth")
    body = f"""## Token validation per request (cached keys)

`python bench/bench_auth.py --seconds {args.seconds:g} --repeats {args.repeats}`
({machine()}; one uvicorn worker; one sequential keep-alive client on the same machine;
medians of {args.repeats} repeats; run {datetime.date.today().isoformat()}). Token: {source},
keys cached (no provider round trip on the request path). Both endpoints are served by
the same gateway process; they differ only in the `get_principal` dependency.

| | `GET /healthz` (public) | `GET /bench/whoami` (bearer token) | authenticated / bare |
|---|---|---|---|
| latency p50 (ms) | {b50:.2f} | {a50:.2f} | {a50 / b50:.2f} |
| latency p99 (ms) | {b99:.2f} | {a99:.2f} | {a99 / b99:.2f} |
| requests/s (1 client) | {brps:.0f} | {arps:.0f} | {arps / brps:.2f} |
| errors (non-200) | {berr} | {aerr} | |

`Authenticator.authenticate` alone, in process: {authenticate_us:.0f} µs per token (median)
— RSA-2048 signature verification plus claims checks and mapping. The rest of the
difference is framework overhead: the `HTTPBearer` security scheme and `get_principal`,
a sync dependency that FastAPI runs in its thread pool (sync on purpose: a token with
an unknown `kid` may trigger a blocking JWKS fetch, which must not block the event loop).
"""
    print(body)
    if not args.no_write:
        write_section("auth", body)


if __name__ == "__main__":
    main()
