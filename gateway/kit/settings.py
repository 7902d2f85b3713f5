"""All settings in one place (env prefix ``ISTHMUS_``), and their groups.

``Settings`` is read from the environment, flat, as it always was. Its groups
(``settings.dispatch``, ``settings.webhooks``, ...) are frozen read-only views built from
those flat fields, one per owner, so a component is handed only its own group by the
composition root (gateway/app.py, gateway/cli.py). Nothing else calls :func:`get_settings`
(tests/layout/test_settings_reads.py). Groups: docs/operations.md, "Settings".
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    # A bad value is named, never echoed: settings hold secrets (the database URL's password).
    model_config = SettingsConfigDict(env_prefix="ISTHMUS_", env_file=None, extra="ignore", hide_input_in_errors=True)

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
    # A validated token is remembered this long (never past its exp; 0: validate every time).
    token_cache_s: float = Field(default=60, ge=0, le=3600)

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
    # ... or once its worker's liveness lock has been gone this long (Postgres; dispatch/liveness.py)
    dispatch_owner_grace_s: float = Field(default=10.0, ge=0, le=3600)
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
    # Attempts in all (the first included) of a job whose spec has no `retry`, on
    # infrastructure failures only (a node failed under it); 1 = never retried (docs/recovery.md).
    retry_max_attempts: int = Field(default=3, ge=1, le=10)
    # Node health (docs/recovery.md, "Node health"): a node is suspect (quarantined) once
    # infrastructure failures on it ended attempts of node_health_min_accounts accounts within
    # node_health_window_s (s); a retry avoids the nodes that failed its job for
    # node_health_avoid_s (s); node_health_quiet_s > 0: a suspect node clears itself after that
    # long (s) without a failure (0: only an admin clears it).
    node_health_window_s: float = Field(default=3600.0, gt=0, le=30 * 86400)
    node_health_min_accounts: int = Field(default=2, ge=1, le=1000)
    node_health_avoid_s: float = Field(default=6 * 3600.0, ge=0, le=30 * 86400)
    node_health_quiet_s: float = Field(default=0.0, ge=0, le=365 * 86400)
    # Reclaim (docs/recovery.md): a borrowed job is never chosen to stop before it has run this
    # long (s) in its attempt; a chosen one gets this long (s) between its signal and its stop;
    # at most this many are chosen per pool in any 60 s.
    preempt_min_runtime_s: float = Field(default=600.0, ge=0, le=30 * 86400)
    preempt_grace_s: float = Field(default=120.0, ge=0, le=86400)
    preempt_max_per_pool_per_minute: int = Field(default=4, ge=0, le=10_000)
    # The gateway's URL as a job on the pools reaches it: the job's ISTHMUS_URL, beside its
    # checkpoint credential ISTHMUS_JOB_TOKEN (docs/recovery.md). Empty: jobs get no ISTHMUS_URL.
    job_api_url: str = ""
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
    # Open streams (GET /v1/events/stream, /ui/events, logs?follow=true), per gateway process
    # (docs/security.md, 27.4): per caller (429 beyond), and in all (503 beyond). max_streams
    # 0: three quarters of max_connections; it must stay below max_connections, so streams
    # never take the connections /healthz and the API need.
    max_streams_per_subject: int = Field(default=10, ge=1, le=100000)
    max_streams: int = Field(default=0, ge=0, le=100000)
    # With `--workers N`, uvicorn's supervisor pings each worker process and kills one that
    # does not answer in time, resetting every connection it holds. uvicorn's 5 s default
    # killed a healthy worker on a loaded 2-core machine (CI, session 5): 30 s by default.
    worker_healthcheck_s: int = Field(default=30, ge=1, le=3600)

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # One JSON object per line with request_id / job_id (gateway/kit/logs.py), or plain text.
    log_format: Literal["json", "text"] = "json"
    access_log: bool = True  # one line per HTTP request: method, path, status, duration
    # A warning or error repeated within this many seconds is logged once, the next one after
    # it counting the rest (gateway/kit/logs.py RepeatFilter); 0 logs every one.
    log_repeat_window_s: float = Field(default=60.0, ge=0, le=86400)

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
    # /metrics (docs/operations.md): computed from the registry at scrape time and cached this long.
    metrics_ttl_s: float = Field(default=5.0, ge=0, le=300)
    # /metrics names every account and its activity (docs/security.md, 27.8). "token": a
    # scraper must send metrics_token as a bearer token, and outside dev mode the gateway
    # refuses to start without one (dev mode without a token: open). "open": no token, by
    # the operator's explicit choice (restrict /metrics at the network). "off": 404.
    metrics_access: Literal["token", "open", "off"] = "token"
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
    # Deliveries one endpoint's claim sends, one after another, before its slot goes back to
    # the fair queue (each endpoint has at most one attempt in flight, across workers).
    webhook_batch: int = Field(default=20, ge=1, le=10000)
    webhook_concurrency: int = Field(default=16, ge=1, le=256)  # attempts in flight at once per process
    # Attempts in flight at once for one account's endpoints, per process: an account whose
    # receivers hang holds at most this many of the process's slots.
    webhook_account_concurrency: int = Field(default=4, ge=1, le=256)
    # The hard deadline of one attempt: connect + TLS + request + whole answer (the socket is
    # shut down when it passes, however slowly the receiver trickles).
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120)
    # Endpoints one account may register (a 429 names it beyond); admin endpoints are not counted.
    webhook_max_endpoints_per_account: int = Field(default=10, ge=0, le=10000)
    # An endpoint is suspended when the subject holding it (creator or last re-enabler) has
    # not been seen holding its account for this long (7 days), or at once when seen without it.
    webhook_holder_unseen_s: float = Field(default=7 * 86400.0, gt=0, le=365 * 86400.0)
    # How often a subject's accounts are written to membership_seen while they stay the same
    # (at most one write per subject per this many seconds per process; a change is written at once).
    membership_seen_write_s: float = Field(default=300.0, ge=0, le=86400)
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

    # The audit log keeps records this many days (0: forever); older ones go when
    # `isthmus admin audit prune` runs (docs/ledger.md, "Audit log").
    audit_retention_days: int = Field(default=400, ge=0, le=36500)

    @field_validator("database_url")
    @classmethod
    def _driver(cls, url: str) -> str:
        """A plain ``postgresql://`` or ``postgres://`` URI (what database operators and managed
        services hand out) means the driver the gateway ships, psycopg 3; another driver named
        in the scheme is refused with what to write instead (docs/deploy.md)."""
        scheme, sep, rest = url.partition("://")
        if not sep:
            return url
        if scheme in ("postgresql", "postgres"):
            return f"postgresql+psycopg://{rest}"
        if scheme.startswith(("postgresql+", "postgres+")) and scheme != "postgresql+psycopg":
            raise ValueError(f"database driver {scheme.partition('+')[2]!r} is not installed: write "
                             "postgresql+psycopg:// (or postgresql://)")
        return url

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.default_time_limit_s > self.max_time_limit_s:
            raise ValueError("default_time_limit_s exceeds max_time_limit_s")
        if self.max_streams >= self.max_connections:
            raise ValueError("max_streams must be below max_connections (streams would take every connection)")
        if self.webhook_lease_s <= self.webhook_timeout_s:
            raise ValueError("webhook_lease_s must exceed webhook_timeout_s")
        if self.membership_seen_write_s * 2 > self.webhook_holder_unseen_s:
            raise ValueError("membership_seen_write_s must be well under webhook_holder_unseen_s")
        return self  # the webhook allow-list is checked by create_app (gateway/webhooks/address.py)

    @property
    def stream_budget(self) -> int:
        """Open streams one process allows in all (max_streams, else 3/4 of max_connections)."""
        return self.max_streams or self.max_connections * 3 // 4

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    # --- the groups (read-only views; a new flat field must join one: tests/ops/test_settings_groups.py)

    @property
    def core(self) -> CoreSettings:
        return CoreSettings.of(self)

    @property
    def identity(self) -> IdentitySettings:
        return IdentitySettings.of(self)

    @property
    def dispatch(self) -> DispatchSettings:
        return DispatchSettings.of(self)

    @property
    def limits(self) -> LimitSettings:
        return LimitSettings.of(self)

    @property
    def server(self) -> ServerSettings:
        return ServerSettings.of(self)

    @property
    def metrics(self) -> MetricsSettings:
        return MetricsSettings.of(self)

    @property
    def ui(self) -> UISettings:
        return UISettings.of(self)

    @property
    def webhooks(self) -> WebhookSettings:
        return WebhookSettings.of(self)


# ------------------------------------------------------------------------------ groups
# Read-only views of the flat settings above, one per owner (docs/operations.md, "Settings").
# The environment and every flat attribute stay as they are; a component that owns a group
# (the dispatcher and its parts, the webhook deliverer) is handed its group by the
# composition root (gateway/app.py, gateway/cli.py) instead of the whole Settings. Each flat
# setting is in exactly one group (tests/ops/test_settings_groups.py).


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Derived values a group carries besides its flat settings (not settings themselves).
    DERIVED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls, settings: Settings) -> Self:
        return cls(**{name: getattr(settings, name) for name in cls.model_fields})


class CoreSettings(_Group):
    """The process: database, dev mode, pools, which loops run in ``serve``, logging."""

    database_url: str
    database_pool_size: int
    dev_mode: bool
    dev_accounts: str
    pools_file: str
    backends: str
    dispatch_in_serve: bool
    webhooks_in_serve: bool
    log_level: Literal["debug", "info", "warning", "error"]
    log_format: Literal["json", "text"]
    access_log: bool
    log_repeat_window_s: float
    audit_retention_days: int
    is_sqlite: bool

    DERIVED = ("is_sqlite",)


class IdentitySettings(_Group):
    """Token validation (gateway/identity/): OIDC issuers and the dev issuer."""

    oidc_issuers: str
    audience: str
    leeway_s: int
    token_cache_s: float
    dev_issuer: str
    dev_key_path: Path


class DispatchSettings(_Group):
    """The dispatcher and its parts (gateway/dispatch/): rounds, leases, retries, scheduling,
    routing, fair share, following jobs, the ledger's accrual and the output it keeps."""

    dispatch_interval_s: float
    dispatch_batch: int
    dispatch_concurrency: int
    dispatch_lease_s: int
    dispatch_owner_grace_s: float
    retry_backoff_base_s: float
    retry_backoff_max_s: float
    capacity_ttl_s: float
    reconcile_resync_s: float
    held_job_fail_after_s: float
    retry_max_attempts: int
    node_health_window_s: float
    node_health_min_accounts: int
    node_health_avoid_s: float
    node_health_quiet_s: float
    preempt_min_runtime_s: float
    preempt_grace_s: float
    preempt_max_per_pool_per_minute: int
    job_api_url: str
    usage_accrual_interval_s: float
    pool_queue_depth: int
    scheduling_policy: Literal["reservation", "greedy"]
    reservation_depth: int
    scheduling_window: int
    scheduling_per_account: int
    routing_weights: str
    routing_cost_factor: float
    fairshare_half_life_s: int
    output_keep_dir: Path
    output_keep_mib: int
    is_sqlite: bool  # no FOR UPDATE SKIP LOCKED: one dispatcher at a time

    DERIVED = ("is_sqlite",)


class LimitSettings(_Group):
    """What a submission may ask for (gateway/jobs/admission.py, gateway/flows/)."""

    min_job_uid: int
    denied_job_users: str
    max_pending_jobs_per_user: int
    max_pending_jobs_per_account: int
    max_idempotency_keys_per_user: int
    idempotency_key_window_s: int
    max_array_tasks: int
    max_sweep_points: int
    default_time_limit_s: int
    max_time_limit_s: int


class ServerSettings(_Group):
    """HTTP: request bodies, connections, headers, open streams and their budget, event streams."""

    max_body_bytes: int
    body_timeout_s: float
    max_connections: int
    max_header_bytes: int
    max_streams_per_subject: int
    max_streams: int
    worker_healthcheck_s: int
    events_heartbeat_s: float
    events_max_stream_s: float
    stream_budget: int

    DERIVED = ("stream_budget",)


class MetricsSettings(_Group):
    """``/metrics`` (gateway/metrics/)."""

    metrics_ttl_s: float
    metrics_access: Literal["token", "open", "off"]
    metrics_token: str = Field(repr=False)


class UISettings(_Group):
    """The ``/ui`` dashboard (gateway/ui/)."""

    ui_oidc_issuer: str
    ui_client_id: str
    ui_client_secret: str = Field(repr=False)
    ui_session_secret: str = Field(repr=False)


class WebhookSettings(_Group):
    """Webhooks (gateway/webhooks/): the deliverer, endpoint limits and holders, the SSRF guard."""

    webhook_interval_s: float
    webhook_batch: int
    webhook_concurrency: int
    webhook_account_concurrency: int
    webhook_timeout_s: float
    webhook_max_endpoints_per_account: int
    webhook_holder_unseen_s: float
    membership_seen_write_s: float
    webhook_lease_s: float
    webhook_backoff_base_s: float
    webhook_backoff_max_s: float
    webhook_disable_after_failures: int
    webhook_settle_s: float
    webhook_allowlist: str
    webhook_ca_file: str
    is_sqlite: bool  # claims without SKIP LOCKED

    DERIVED = ("is_sqlite",)


GROUPS: dict[str, type[_Group]] = {
    "core": CoreSettings, "identity": IdentitySettings, "dispatch": DispatchSettings, "limits": LimitSettings,
    "server": ServerSettings, "metrics": MetricsSettings, "ui": UISettings, "webhooks": WebhookSettings,
}


def default_dev_key_path() -> Path:
    """``$XDG_CONFIG_HOME/isthmus/dev-issuer-key.pem``, else ``~/.config/isthmus/dev-issuer-key.pem``."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "isthmus" / "dev-issuer-key.pem"


@functools.lru_cache
def get_settings() -> Settings:
    return Settings()
