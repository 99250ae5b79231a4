"""Django settings for agentrun.

Everything comes from environment variables with small helpers. With no
DATABASE_URL / CELERY_BROKER_URL set, agentrun runs "embedded": SQLite in WAL
mode and a Celery broker on the local filesystem, both under ./var/.
"""

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("AGENTRUN_VAR_DIR", BASE_DIR / "var"))


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def database_from_url(url: str) -> dict:
    """postgres://user:pass@host:port/name?opt=v  or  sqlite:///path."""
    parts = urlparse(url)
    if parts.scheme == "sqlite":
        return sqlite_database(Path(unquote(parts.path)))
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r}")
    options: dict = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    # Behind PgBouncer in transaction pooling mode each transaction may run on another
    # server connection: nothing may outlive a transaction on the server (a prepared
    # statement, a cursor held open between transactions).
    pgbouncer = env_bool("AGENTRUN_PGBOUNCER", False)
    # The engine's step statements (agentrun/store/rawsql.py) are prepared on the server;
    # Django's own queries never are. Behind a pooler that can't keep prepared
    # statements, AGENTRUN_PGBOUNCER=1 (or ?prepare_threshold=none in the URL) turns that off.
    threshold = options.pop("prepare_threshold", "none" if pgbouncer else "5")
    options["prepare_threshold"] = None if threshold.lower() in ("", "none") else int(threshold)
    # A bounded pool per process (web or worker): a step hands its connection back
    # while it waits on a model or a tool, so DB_POOL_MAX_SIZE connections serve every
    # step in flight in the process. DB_POOL_MAX_SIZE=0: a connection per thread, kept
    # for DB_CONN_MAX_AGE seconds (Django's own persistent connections).
    pool_max = env_int("DB_POOL_MAX_SIZE", 10)
    if pool_max > 0:
        options["pool"] = {
            "min_size": min(env_int("DB_POOL_MIN_SIZE", 1), max(pool_max - 1, 1)),
            # One of the process's connections is its lease watchdog's own, so that
            # leases are renewed even when steps hold every pooled connection.
            "max_size": max(pool_max - 1, 1),
            # How long a thread waits for a free connection before its step fails
            # (the step is then retried from its pre snapshot).
            "timeout": env_float("DB_POOL_TIMEOUT", 30.0),
        }
    return {
        # Django's, checking each connection it takes from the pool
        # (agentrun/infra/postgresql/base.py).
        "ENGINE": "agentrun.infra.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        # Pooled connections go back to the pool instead (Django refuses both at once).
        "CONN_MAX_AGE": 0 if pool_max > 0 else env_int("DB_CONN_MAX_AGE", 60),
        # Without a pool, a persistent connection is checked before a request uses it; a
        # pooled one as it is taken from the pool (the ENGINE's). One the server closed (a
        # restart, an idle timeout) is replaced, never given to a request or a step.
        "CONN_HEALTH_CHECKS": pool_max == 0,
        # QuerySet.iterator() outside a transaction holds a cursor open across them.
        "DISABLE_SERVER_SIDE_CURSORS": pgbouncer,
    }


def sqlite_database(path: Path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        # IMMEDIATE avoids lock-upgrade deadlocks between the web server and workers.
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        },
        # A test database must be a file too: worker processes open it.
        "TEST": {"NAME": str(path.with_name("test_" + path.name))},
    }


DATABASE_URL = env("DATABASE_URL")
# The database is reached through PgBouncer in transaction pooling mode (database_from_url).
AGENTRUN_PGBOUNCER = env_bool("AGENTRUN_PGBOUNCER", False)
EMBEDDED = not DATABASE_URL

# Unset, the embedded default: `check --deploy` fails with it (agentrun.security.checks).
SECRET_KEY = env("SECRET_KEY", "embedded-insecure-key-set-SECRET_KEY-in-production")
DEBUG = env_bool("DEBUG", EMBEDDED)
ALLOWED_HOSTS = [h.strip() for h in env("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")]
CSRF_TRUSTED_ORIGINS = [o for o in env("CSRF_TRUSTED_ORIGINS").split(",") if o]

# HTTPS: AGENTRUN_HTTPS=1 when the site is served only over TLS, usually ended by a
# reverse proxy. Off by default: a Secure cookie never comes back over plain http,
# so turning these on without TLS would break every login (the embedded mode, dev).
AGENTRUN_HTTPS = env_bool("AGENTRUN_HTTPS", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", AGENTRUN_HTTPS)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", AGENTRUN_HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", AGENTRUN_HTTPS)
# Browsers remember HSTS for this long: they will refuse plain http to the host.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if AGENTRUN_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", AGENTRUN_HTTPS)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", AGENTRUN_HTTPS)
# Behind a TLS proxy gunicorn sees plain http: trust the proxy's header saying the
# client used https. Only safe when the proxy overwrites that header and nothing
# else can reach gunicorn. Empty: trust no header (TLS ends in gunicorn itself).
_proxy_header = env("AGENTRUN_PROXY_SSL_HEADER", "X-Forwarded-Proto" if AGENTRUN_HTTPS else "")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_header.strip().upper().replace("-", "_"), "https")
    if _proxy_header.strip()
    else None
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "agentrun",
    "debugger",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A database that is down or restarting: 503 with Retry-After, not a 500 (agentrun/infra/outage.py).
    "agentrun.infra.outage.DatabaseUnavailableMiddleware",
    # Long run pages (a 1,000-step timeline is ~600 KB of HTML) compress ~10x.
    "django.middleware.gzip.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "debugger.middleware.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "agentrun.urls"
WSGI_APPLICATION = "agentrun.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {"default": sqlite_database(VAR_DIR / "agentrun.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS: list[dict] = []
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "debugger:run-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# Room for an operator's edited state (fork_run accepts up to 8x the input limit, as
# pretty JSON in the browser); a 10 MB body is still refused before it is parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 9 * 1024 * 1024)

# --- Celery: the broker is only a wake-up; the database is the truth. -------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "filesystem://")
AGENTRUN_STEP_TIME_LIMIT = env_int("AGENTRUN_STEP_TIME_LIMIT", 300)
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {
    # Redelivery of an unacked message must come after the hard time limit.
    "visibility_timeout": AGENTRUN_STEP_TIME_LIMIT * 2 + 60,
}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _d in ("queue", "processed", "control"):
        (_broker_dir / _d).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS.update(
        data_folder_in=str(_broker_dir / "queue"),
        data_folder_out=str(_broker_dir / "queue"),
        processed_folder=str(_broker_dir / "processed"),
        control_folder=str(_broker_dir / "control"),
        store_processed=False,
        # kombu polls a folder; its default of 1 s would make every step wait.
        polling_interval=0.05,
    )
# Steps wait on models and tools far longer than they compute: one worker process
# runs many at once in threads (Celery's threads pool), each handing its database
# connection back to the pool while it waits. SQLite has one writer: a few threads
# (whether it is the embedded default or named by a sqlite:/// DATABASE_URL).
CELERY_WORKER_POOL = env("AGENTRUN_WORKER_POOL", "threads")
_SQLITE = DATABASES["default"]["ENGINE"].endswith("sqlite3")
# A step waiting on a model holds a thread and about 110 KB (bench/bench_waiting.py: the
# worker's RSS over the steps waiting, 200 to 1,000 of them), and no database connection:
# 3,000 waiting steps are about 0.5 GB. SQLite has one writer: a few threads.
AGENTRUN_WORKER_CONCURRENCY = env_int("AGENTRUN_WORKER_CONCURRENCY", 8 if _SQLITE else 3000)
CELERY_WORKER_CONCURRENCY = AGENTRUN_WORKER_CONCURRENCY
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SOFT_TIME_LIMIT = AGENTRUN_STEP_TIME_LIMIT
CELERY_TASK_TIME_LIMIT = AGENTRUN_STEP_TIME_LIMIT + 30
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fixup closes the database connections before and after every task
# unless this is set, then once every this many tasks; in between agentrun.celery
# closes them as Django does after a request (broken, or older than CONN_MAX_AGE).
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
AGENTRUN_RECONCILE_EVERY = env_float("AGENTRUN_RECONCILE_EVERY", 5.0)
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "agentrun.reconcile", "schedule": AGENTRUN_RECONCILE_EVERY},
}

# --- retention -------------------------------------------------
# Finished runs' steps, snapshots and read calls are purged this many days after they
# finished (pinned runs and their fork lineage excepted); 0 keeps everything forever.
AGENTRUN_RETENTION_DAYS = env_float("AGENTRUN_RETENTION_DAYS", 30.0)
if AGENTRUN_RETENTION_DAYS < 0:
    raise ValueError("AGENTRUN_RETENTION_DAYS must be 0 (keep forever) or more")
# Seconds between purge passes (beat); see agentrun.lifecycle.retention.pass_budget for how long one works.
AGENTRUN_PURGE_EVERY = env_float("AGENTRUN_PURGE_EVERY", 3600.0)
# Rows one purge statement deletes (each its own short transaction).
AGENTRUN_PURGE_BATCH = env_int("AGENTRUN_PURGE_BATCH", 1000)
CELERY_BEAT_SCHEDULE["purge"] = {"task": "agentrun.purge", "schedule": AGENTRUN_PURGE_EVERY}

# --- agentrun runtime --------------------------------------------------------
# A claimed step is owned for this long; a worker that dies is replaced after it.
AGENTRUN_LEASE_SECONDS = env_float("AGENTRUN_LEASE_SECONDS", 60.0)
# Modules that define your agents and tools (imported at start-up), comma-separated.
AGENTRUN_AGENT_MODULES = [m.strip() for m in env("AGENTRUN_AGENT_MODULES").split(",") if m.strip()]
# LangGraph graphs agentrun's workers may run (forks of their threads, runs started here),
# comma-separated, each the `module:attribute` of a compiled graph (needs agentrun[langgraph]).
AGENTRUN_LANGGRAPH_GRAPHS = [
    g.strip() for g in env("AGENTRUN_LANGGRAPH_GRAPHS").split(",") if g.strip()
]

# The code version this process runs (a release tag, a commit); unset: the deployment's
# commit and a hash of the registered agents' and tools' source (agentrun.engine.versions).
# Every step records the version of the worker that executed it; a fork onto a version is
# executed only by workers of that version.
AGENTRUN_CODE_VERSION = env("AGENTRUN_CODE_VERSION")
# Where the dashboard is, for links printed by commands and sent in messages.
AGENTRUN_SITE_URL = env("AGENTRUN_SITE_URL", "http://127.0.0.1:8000").rstrip("/")
# A worker process says it is alive this often (seconds); after three silent beats it no
# longer counts as one that can execute a run asking for its version.
AGENTRUN_WORKER_HEARTBEAT_SECONDS = env_float("AGENTRUN_WORKER_HEARTBEAT_SECONDS", 5.0)
# A replay batch's forks in flight at once, unless the batch says otherwise: the rest wait
# their turn, so a batch never takes every worker thread from the other runs.
AGENTRUN_BATCH_MAX_IN_FLIGHT = env_int("AGENTRUN_BATCH_MAX_IN_FLIGHT", 100)
# The most runs one replay batch takes (a filter that selects more is refused: narrow it).
AGENTRUN_BATCH_MAX_RUNS = env_int("AGENTRUN_BATCH_MAX_RUNS", 10_000)
# Scripted "fault" points kill the worker on purpose: for demos and tests only.
AGENTRUN_FAULTS = env_bool("AGENTRUN_FAULTS", EMBEDDED)
AGENTRUN_MAX_INPUT_BYTES = env_int("AGENTRUN_MAX_INPUT_BYTES", 1024 * 1024)
AGENTRUN_MAX_STEPS = env_int("AGENTRUN_MAX_STEPS", 10_000)
# JSON limits, the same at every entry (agentrun.security.storable): a value that goes into a state
# (run input, tool arguments and results, a model's reply) nests at most this many levels
# (a whole state 20 more), and a tool's result or a model's reply is at most this large.
AGENTRUN_JSON_MAX_DEPTH = env_int("AGENTRUN_JSON_MAX_DEPTH", 64)
AGENTRUN_JSON_MAX_BYTES = env_int("AGENTRUN_JSON_MAX_BYTES", 8 * 1024 * 1024)
# A step that crashed this many times (an exception outside a tool, or its worker died
# mid-step) is not tried again: its run waits for an operator.
AGENTRUN_MAX_STEP_ATTEMPTS = env_int("AGENTRUN_MAX_STEP_ATTEMPTS", 5)
# Don't enqueue from inside the web process/tests when a test drives the engine itself.
AGENTRUN_ENQUEUE = env_bool("AGENTRUN_ENQUEUE", True)
# A worker task goes on with the next step of its run (claimed by the commit, no
# broker round trip, no second claim, the state already in memory) until this many
# seconds have passed, then hands the run back to the queue so other runs get their
# turn. A step waiting on a model holds a thread, not a process, so the chain can be
# long: 30 s took a third off an LLM step's worker CPU. 0: one step per task.
AGENTRUN_CHAIN_SECONDS = env_float("AGENTRUN_CHAIN_SECONDS", 30.0)

# The LLM agent: OpenAI-compatible chat completions. The key is read at call
# time from the environment and never stored.
AGENTRUN_LLM_BASE_URL = env("AGENTRUN_LLM_BASE_URL", "https://api.openai.com/v1")
# Prices per million tokens, by model, for the cost of runs: JSON such as
# {"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached_input": 0.075}} (cached_input:
# the input tokens the provider served from its cache; default the input price).
AGENTRUN_LLM_PRICES = env("AGENTRUN_LLM_PRICES", "{}")
AGENTRUN_LLM_MODEL = env("AGENTRUN_LLM_MODEL", "gpt-4o-mini")
AGENTRUN_LLM_TIMEOUT = env_float("AGENTRUN_LLM_TIMEOUT", 60.0)
# Requests in flight to the provider per process: more steps than this wait their turn
# (holding no database connection) instead of stampeding the provider.
# Model requests in flight per process at most; by default as many as the steps in flight.
AGENTRUN_LLM_MAX_CONCURRENCY = env_int("AGENTRUN_LLM_MAX_CONCURRENCY", AGENTRUN_WORKER_CONCURRENCY)
# Each worker process keeps the latest state of the runs it works on, up to this size.
AGENTRUN_STATE_CACHE_MB = env_int("AGENTRUN_STATE_CACHE_MB", 256)
# Each web process keeps the text of the tool calls of the runs searched last (a
# 10,000-step run of the bench workload: ~30 MB), up to this size.
AGENTRUN_SEARCH_CACHE_MB = env_int("AGENTRUN_SEARCH_CACHE_MB", 64)
# A run that ends with at least this many steps gets a stored search index of its tool
# calls' text (agentrun.store.callsearch): a first search of a 10,000-step run in 45 ms, not
# 0.4 s, for about 1.5 KB a step. Shorter runs are scanned as fast without one. 0: none.
AGENTRUN_SEARCH_INDEX_STEPS = env_int("AGENTRUN_SEARCH_INDEX_STEPS", 2000)

# A run that ends with at least this many steps has its deltas regrouped by a worker
# (agentrun.store.compaction): a third fewer bytes, and a history that reads every step reads
# fewer compressed streams. 0: never.
AGENTRUN_COMPACT_STEPS = env_int("AGENTRUN_COMPACT_STEPS", 1000)

# Importing a run's archive (agentrun.lifecycle.archive): the archive's size as uploaded, what it
# may inflate to (a gzip bomb stops here, not in memory) and its longest line (one record).
AGENTRUN_IMPORT_MAX_BYTES = env_int("AGENTRUN_IMPORT_MAX_BYTES", 1024**3)
AGENTRUN_IMPORT_MAX_EXPANDED_BYTES = env_int("AGENTRUN_IMPORT_MAX_EXPANDED_BYTES", 8 * 1024**3)
AGENTRUN_IMPORT_MAX_LINE_BYTES = env_int("AGENTRUN_IMPORT_MAX_LINE_BYTES", 256 * 1024**2)

# --- observability (docs/operations/observability.md) -------------------------------------
# The web's /metrics answers only a request with "Authorization: Bearer <this token>";
# unset, /metrics is off (404). It reads the database at most once per this many seconds.
AGENTRUN_METRICS_TOKEN = env("AGENTRUN_METRICS_TOKEN")
AGENTRUN_METRICS_CACHE_SECONDS = env_float("AGENTRUN_METRICS_CACHE_SECONDS", 5.0)
# Each worker process serves its own metrics (steps, model requests, tool calls it ran) on
# this port, bound to this address (no login: bind it where only Prometheus reaches). 0: off.
AGENTRUN_WORKER_METRICS_PORT = env_int("AGENTRUN_WORKER_METRICS_PORT", 0)
AGENTRUN_WORKER_METRICS_ADDR = env("AGENTRUN_WORKER_METRICS_ADDR", "127.0.0.1")
# Traces are configured by the standard OTEL_* variables. The run page links to the run's
# trace in the operator's tracing UI through this template ({trace_id}: 32 hex digits).
AGENTRUN_TRACE_URL = env("AGENTRUN_TRACE_URL")
# A span attribute longer than this (UTF-8 bytes) is cut, and says how long it was.
AGENTRUN_TRACE_MAX_ATTRIBUTE_BYTES = env_int("AGENTRUN_TRACE_MAX_ATTRIBUTE_BYTES", 4096)
# A committed step whose spans' export is not on record this many seconds after its commit
# (its worker was killed first, or the receiver was down) has them emitted again from its
# rows by the reconciler; until this many seconds after the commit, then it gives up.
AGENTRUN_TRACE_REEMIT_AFTER = env_float("AGENTRUN_TRACE_REEMIT_AFTER", 60.0)
AGENTRUN_TRACE_REEMIT_WITHIN = env_float("AGENTRUN_TRACE_REEMIT_WITHIN", 3600.0)
# The failure webhook (agentrun.telemetry.webhooks): JSON posted here when a run fails or a
# step keeps crashing, signed (HMAC-SHA256) with the secret, which is then required.
AGENTRUN_WEBHOOK_URL = env("AGENTRUN_WEBHOOK_URL")
AGENTRUN_WEBHOOK_SECRET = env("AGENTRUN_WEBHOOK_SECRET")
if AGENTRUN_WEBHOOK_URL and urlparse(AGENTRUN_WEBHOOK_URL).scheme not in ("http", "https"):
    raise ValueError("AGENTRUN_WEBHOOK_URL must be an http:// or https:// URL")
if AGENTRUN_WEBHOOK_URL and not AGENTRUN_WEBHOOK_SECRET:
    raise ValueError("AGENTRUN_WEBHOOK_URL needs AGENTRUN_WEBHOOK_SECRET to sign what it sends")
# A failed delivery is tried again after this many seconds, doubled each time (at most an
# hour), until this many attempts; each attempt waits this long for an answer.
AGENTRUN_WEBHOOK_RETRY_SECONDS = env_float("AGENTRUN_WEBHOOK_RETRY_SECONDS", 10.0)
AGENTRUN_WEBHOOK_MAX_ATTEMPTS = env_int("AGENTRUN_WEBHOOK_MAX_ATTEMPTS", 8)
AGENTRUN_WEBHOOK_TIMEOUT = env_float("AGENTRUN_WEBHOOK_TIMEOUT", 10.0)
# A run not ended and unchanged for this many minutes is notified as stuck (once per step); 0: never.
AGENTRUN_WEBHOOK_STUCK_MINUTES = env_float("AGENTRUN_WEBHOOK_STUCK_MINUTES", 60.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # Celery's lines about each reconciler pass are DEBUG (agentrun/infra/logs.py).
    "filters": {"quiet_routine_tasks": {"()": "agentrun.infra.logs.QuietRoutineTasks"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["quiet_routine_tasks"],
        }
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The LLM client's line per request ("HTTP Request: POST ...") only at DEBUG: a
        # worker makes a thousand a second, and each step records its request anyway.
        "httpx2": {"level": "DEBUG" if env("LOG_LEVEL", "INFO") == "DEBUG" else "WARNING"},
    },
}
