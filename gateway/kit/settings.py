"""All settings in one place (env prefix ``ISTHMUS_``)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ISTHMUS_", env_file=None, extra="ignore")

    # Embedded default: a SQLite file next to where the gateway runs. Production: Postgres,
    # e.g. postgresql+psycopg://isthmus:secret@db:5432/isthmus
    database_url: str = "sqlite:///./isthmus.db"
    database_pool_size: int = Field(default=10, ge=1, le=200)

    # Dev mode enables the local development issuer (``isthmus token``) and demo accounts.
    # Outside dev mode the gateway refuses to start without a real OIDC issuer.
    dev_mode: bool = False
    # One place whatever the current directory, so `isthmus token` and `isthmus serve` run
    # from anywhere use the same key (docs/identity.md).
    dev_key_path: Path = Field(default_factory=lambda: default_dev_key_path())
    dev_issuer: str = "urn:isthmus:dev-issuer"
    dev_accounts: str = "team-a,team-b"  # created on start in dev mode if missing

    # OIDC: JSON list of issuer configs, see docs/identity.md
    oidc_issuers: str = "[]"
    audience: str = "isthmus"
    leeway_s: int = Field(default=30, ge=0, le=300)

    # Pools: a YAML pools file (docs/pools.md), or the older JSON object keyed by pool name
    # {"slurm": {...adapter settings}, "gpu-b": {"kind": "kubernetes", ...}}; set one of the two.
    pools_file: str = ""
    backends: str = "{}"
    # The dispatcher runs inside `isthmus serve` unless turned off (then run `isthmus worker`).
    dispatch_in_serve: bool = True
    dispatch_interval_s: float = Field(default=1.0, gt=0, le=60)
    dispatch_batch: int = Field(default=100, ge=1, le=10000)
    # Claimed jobs of one round are submitted by this many threads (backend calls are I/O).
    dispatch_concurrency: int = Field(default=8, ge=1, le=64)
    dispatch_lease_s: int = Field(default=120, ge=1, le=3600)  # a DISPATCHING claim expires after this
    retry_backoff_base_s: float = Field(default=2.0, gt=0, le=600)
    retry_backoff_max_s: float = Field(default=300.0, gt=0, le=3600)
    capacity_ttl_s: float = Field(default=2.0, ge=0, le=600)
    # Backends with a change feed (Kubernetes) are followed by their watch; every job on
    # them is still polled once per this many seconds, a safety net for a missed event
    # (docs/dispatch.md, "Following jobs").
    reconcile_resync_s: float = Field(default=60.0, gt=0, le=86400)
    # A job its backend holds for something only an administrator can fix (Slurm BeginTime
    # after a failed launch, InvalidAccount, InvalidQOS: usually a user without a POSIX
    # account or association on the cluster) is cancelled there and failed, with the reason
    # in the user's words, once held this long (s); 0 = wait forever (docs/dispatch.md,
    # "Jobs held for an unknown user"). Keep it above Slurm's ~2 min hold after a requeue.
    held_job_fail_after_s: float = Field(default=600.0, ge=0, le=30 * 86400)
    # Charge running jobs' usage this often (s), so fair share sees long jobs as they run; 0 = only at the end.
    usage_accrual_interval_s: float = Field(default=300.0, ge=0, le=86400)
    # Jobs a pool may have queued (accepted, waiting) beyond what fits now. 0: jobs wait in
    # the gateway, where fair share orders them, until the whole gang fits (docs/dispatch.md).
    pool_queue_depth: int = Field(default=0, ge=0, le=100000)
    # Who starts next (docs/dispatch.md, "Reservations and backfill"): "reservation" gives the
    # top reservation_depth waiting jobs a planned start that no lower job may delay
    # (conservative backfill across pools); "greedy" starts whatever fits now.
    scheduling_policy: Literal["reservation", "greedy"] = "reservation"
    reservation_depth: int = Field(default=8, ge=0, le=10000)
    # A round looks at no more than this many pending jobs, and at no more than
    # scheduling_per_account of one account's, so one account's unadmittable jobs cannot
    # hide another account's job that fits (head-of-line blocking).
    # Each job looked at costs a few ledger queries (budget, admission per pool).
    scheduling_window: int = Field(default=128, ge=1, le=100000)
    scheduling_per_account: int = Field(default=16, ge=1, le=100000)
    # Fault-injection hooks for the crash tests (docs/dispatch.md); keep 0 in production.
    debug_pause_after_claim_s: float = Field(default=0.0, ge=0, le=600)
    debug_pause_after_submit_s: float = Field(default=0.0, ge=0, le=600)
    # Routing policy: preference weight per pool (higher wins ties), see docs/dispatch.md.
    # Multiplies the pool's own weight (pools file, PATCH /v1/admin/pools/{name}); kept for old configs.
    routing_weights: str = '{"slurm": 1.0, "kubernetes": 1.0}'
    # How much a pool's cost (billing weight) counts when several pools fit a job now: the
    # score drops by this x (cost / cheapest fitting cost - 1); 0 ignores cost.
    routing_cost_factor: float = Field(default=1.0, ge=0, le=100)

    # Jobs never run as a system account (docs/security.md, finding 6): a POSIX user whose
    # uid (as this host resolves it) is below min_job_uid, one in this comma-separated
    # deny-list, or the gateway's own user is refused at submit with a 403.
    min_job_uid: int = Field(default=1000, ge=0, le=2**31)
    denied_job_users: str = ("root,daemon,bin,sys,sync,games,man,lp,mail,news,uucp,proxy,www-data,backup,list,"
                             "irc,nobody,slurm,slurmrestd,munge,postgres,isthmus")

    # Caps checked at submit (docs/jobs.md, "Caps at submit"; 429 naming the limit). Jobs
    # count while waiting (pending, dispatching, queued, requeued). An account's own
    # max_queued_jobs / max_queued_jobs_per_user (admin API) apply on top; this account
    # default applies where neither the account nor an ancestor sets max_queued_jobs.
    max_pending_jobs_per_user: int = Field(default=1000, ge=1, le=10_000_000)
    max_pending_jobs_per_account: int = Field(default=10000, ge=1, le=10_000_000)
    # Idempotency keys a caller may create per idempotency_key_window_s (replays are free).
    max_idempotency_keys_per_user: int = Field(default=10000, ge=1, le=10_000_000)
    idempotency_key_window_s: int = Field(default=86400, ge=60, le=366 * 86400)

    # Job sets (docs/jobs.md, "Arrays and sweeps"): tasks per array request, and points per
    # sweep (the product of its value lists). A set is one transaction; 422 names the field.
    max_array_tasks: int = Field(default=10000, ge=1, le=100_000)
    max_sweep_points: int = Field(default=1000, ge=1, le=100_000)

    default_time_limit_s: int = Field(default=3600, ge=60)
    max_time_limit_s: int = Field(default=30 * 24 * 3600, ge=60)

    fairshare_half_life_s: int = Field(default=7 * 24 * 3600, ge=60, le=10 * 365 * 24 * 3600)  # docs/ledger.md

    # Request bodies (docs/security.md, finding 5): larger ones get 413 before they are
    # read; a body that has not fully arrived this long after the request started gets 408.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    body_timeout_s: float = Field(default=10.0, gt=0, le=600)
    # `isthmus serve` (uvicorn): connections + requests in flight beyond this get 503, and
    # the request line + headers may be at most this large (a token is up to 16 KiB).
    max_connections: int = Field(default=1000, ge=1, le=100000)
    max_header_bytes: int = Field(default=32 * 1024, ge=8 * 1024, le=1024 * 1024)
    # With `--workers N`, uvicorn's supervisor pings each worker process and kills one that
    # does not answer in time, resetting every connection it holds. uvicorn's 5 s default
    # killed a healthy worker on a loaded 2-core machine (CI, session 5): 30 s by default.
    worker_healthcheck_s: int = Field(default=30, ge=1, le=3600)

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # One JSON object per line with request_id / job_id (gateway/kit/logs.py), or plain text.
    log_format: Literal["json", "text"] = "json"
    access_log: bool = True  # one line per HTTP request: method, path, status, duration

    # /metrics (docs/operations.md): computed from the registry at scrape time and cached
    # this long; when a token is set, scrapers must send it as a bearer token.
    # Server-sent events (GET /v1/events/stream, docs/logs.md): a comment line after this much
    # silence keeps proxies from closing the stream; a stream ends after max_stream_s and the
    # client reconnects with Last-Event-ID (its token is checked again then).
    events_heartbeat_s: float = Field(default=15.0, gt=0, le=300)
    events_max_stream_s: float = Field(default=3600.0, gt=0, le=86400)
    # Job output of pools that delete it with the job (Kubernetes pods, docs/logs.md): the
    # last OUTPUT_KEEP_MIB MiB per worker are kept here when the job ends. The API and the
    # dispatcher (`isthmus worker`) must see the same directory.
    output_keep_dir: Path = Path("./isthmus-output")
    output_keep_mib: int = Field(default=8, ge=1, le=1024)
    metrics_ttl_s: float = Field(default=5.0, ge=0, le=300)
    metrics_token: str = Field(default="", repr=False)

    # The /ui dashboard (docs/ui.md): it logs people in with this issuer's authorization code
    # + PKCE flow, as this (public, unless a secret is set) client. Empty issuer: /ui says it
    # is not configured. The session secret signs the /ui cookie; outside dev mode it must be
    # set when /ui is on (dev mode: a random one per process).
    ui_oidc_issuer: str = ""
    ui_client_id: str = "isthmus"
    ui_client_secret: str = Field(default="", repr=False)
    ui_session_secret: str = Field(default="", repr=False)
    # Webhooks (docs/webhooks.md). The delivery thread runs in `isthmus worker`, and in
    # `isthmus serve` too when webhooks_in_serve is set.
    webhooks_in_serve: bool = False
    webhook_interval_s: float = Field(default=0.5, gt=0, le=60)  # how often the outbox is read
    webhook_batch: int = Field(default=200, ge=1, le=10000)  # deliveries claimed per round
    webhook_concurrency: int = Field(default=8, ge=1, le=64)  # deliveries sent at once per worker
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120)  # connect + response, per attempt
    # A claimed delivery is due again this long after its claim if its worker died; > timeout.
    webhook_lease_s: float = Field(default=60.0, gt=0, le=3600)
    webhook_backoff_base_s: float = Field(default=5.0, gt=0, le=3600)
    webhook_backoff_max_s: float = Field(default=3600.0, gt=0, le=86400)
    # After this many failed attempts in a row (no success between) the endpoint is disabled.
    webhook_disable_after_failures: int = Field(default=20, ge=1, le=100000)
    # A gap in job_event ids (a transaction not yet committed, or rolled back) holds the
    # outbox cursor this long before it is taken for a rollback.
    webhook_settle_s: float = Field(default=30.0, ge=0, le=3600)
    # Admin exceptions to the SSRF guard: comma-separated CIDRs and host names that may be
    # private/loopback/link-local; only these hosts may be reached over plain http.
    webhook_allowlist: str = ""
    # Extra CA certificates (PEM file) trusted for receivers, besides the system's roots.
    webhook_ca_file: str = ""

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        if self.default_time_limit_s > self.max_time_limit_s:
            raise ValueError("default_time_limit_s exceeds max_time_limit_s")
        if self.webhook_lease_s <= self.webhook_timeout_s:
            raise ValueError("webhook_lease_s must exceed webhook_timeout_s")
        from gateway.webhooks.address import Allowlist

        Allowlist.parse(self.webhook_allowlist)  # a typo fails at start, not at the first delivery
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def default_dev_key_path() -> Path:
    """``$XDG_CONFIG_HOME/isthmus/dev-issuer-key.pem``, else ``~/.config/isthmus/dev-issuer-key.pem``."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "isthmus" / "dev-issuer-key.pem"


@functools.lru_cache
def get_settings() -> Settings:
    return Settings()
