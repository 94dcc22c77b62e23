"""Settings, all read from the environment so one image serves `make run`, CI and compose.

DATABASE_URL  default: SQLite at var/ringside.sqlite3
REDIS_URL     Celery broker, channel layer and event bus; `manage.py serve` sets it to its
              embedded Redis when unset
SECRET_KEY    default: generated once into var/secret_key
DEBUG         "1"/"true" to enable
RUNS_DIR      where jobs write their spec, events, logs and checkpoints (default runs/)
RINGSIDE_STORAGE_URL  an object-store prefix (s3://bucket/ringside) for jobs' checkpoints
              instead of RUNS_DIR: <url>/<job id>/checkpoints
RINGSIDE_DATA_ROOTS   comma-separated folders (or object-store prefixes) every user's jobs may
              read datasets, tokenizers and model.init_from from, besides the user's own
              uploads (default: the built-in corpus, the Python standard library's source)
RINGSIDE_UPLOADS_DIR  where uploaded files go, a folder per user (default var/uploads)
RINGSIDE_UPLOAD_MAX_BYTES  the largest file a user may upload (default 256 MiB)
RINGSIDE_DATASET_SHARD_BYTES  source bytes per token shard of a dataset (default: the engine's,
              256 MiB); a killed prepare resumes from its last finished shard
RINGSIDE_ALLOWED_HOSTS    host names the server answers to, comma list (default: localhost,
                          127.0.0.1, [::1]); add the name clients use when serving others
RINGSIDE_TRUSTED_PROXIES  your proxies' addresses or CIDRs, comma list: only a request from
                          one of them has its X-Forwarded-For/-Proto believed (default: none)
THROTTLE_LOGIN          password attempts per client address (default 20/minute)
THROTTLE_LOGIN_ACCOUNT  password attempts per username, from any address (default 10/minute)
(WEB_PROCESSES, PORT and HOST are read by `manage.py serve` and `manage.py web`.)

A worker host (`manage.py worker`, hosts.registry):
RINGSIDE_HOST_NAME     its name (default: the machine's hostname); one live worker per name
RINGSIDE_HOST_ADDRESS  where its peers reach it (default: the address of the interface that
                       reaches Redis)
WORKER_SLOTS           ranks it runs at once on CPU (default: the core count, at least 8); a
                       GPU host has one slot per GPU
WORKER_LABELS          k=v,k=v
HOST_BEAT_S            its beat (default 5 s); HOST_LOST_AFTER_S: lost without one (30 s)
"""

import ipaddress
import os
import secrets
import socket
import sysconfig
from pathlib import Path

import dj_database_url
import plotly

# Whatever a platform process creates (the database and its -wal/-shm, var/, runs/ and every
# job's files, the secret key) is its owner's only: other accounts of a shared machine read
# none of it. Every platform process (web, worker, beat, manage.py) loads these settings first.
OWNER_ONLY_UMASK = 0o077
os.umask(OWNER_ONLY_UMASK)


def _items(text: str) -> list[str]:
    """The entries of a comma-separated setting, without blanks."""
    return [item.strip() for item in text.split(",") if item.strip()]


REPO_ROOT = Path(__file__).resolve().parents[2]
VAR_DIR = Path(os.environ.get("RINGSIDE_VAR_DIR", REPO_ROOT / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)
RUNS_DIR = Path(os.environ.get("RUNS_DIR", REPO_ROOT / "runs")).resolve()
# what a user's job may read and where it writes (jobs.confinement)
STORAGE_URL = os.environ.get("RINGSIDE_STORAGE_URL", "").rstrip("/")
DATA_ROOTS = _items(os.environ.get("RINGSIDE_DATA_ROOTS", sysconfig.get_paths()["stdlib"]))
UPLOADS_DIR = Path(os.environ.get("RINGSIDE_UPLOADS_DIR", VAR_DIR / "uploads")).resolve()
UPLOAD_MAX_BYTES = int(os.environ.get("RINGSIDE_UPLOAD_MAX_BYTES", str(256 << 20)))
# source bytes per token shard of a dataset's prepare (datasets.tasks); 0: the engine's default.
# A prepare resumes at shard granularity.
DATASET_SHARD_BYTES = int(os.environ.get("RINGSIDE_DATASET_SHARD_BYTES", "0"))


def _owner_only(*paths: Path) -> None:
    """Take group and other permissions off what an older version (or another umask) left
    readable: folders 0700, files 0600. Only paths this account owns: a folder an operator
    mounted for us (owned by someone else) keeps the modes they gave it."""
    for path in paths:
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            path.chmod(0o700 if path.is_dir() else 0o600)


def _env_flag(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in ("1", "true", "yes", "on")


def _labels(text: str) -> dict[str, str]:
    """WORKER_LABELS: `k=v,k=v` (empty: none)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    bad = [item for item in items if "=" not in item or not item.split("=", 1)[0].strip()]
    if bad:
        raise ValueError(f"WORKER_LABELS: expected k=v,k=v, got {', '.join(bad)!r}")
    return {k.strip(): v.strip() for k, v in (item.split("=", 1) for item in items)}


def _secret_key() -> str:
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    path = VAR_DIR / "secret_key"
    if not path.exists():
        # exclusive create: two processes starting together must agree on one key
        try:
            with path.open("x") as f:  # 0600 by the umask, from its first byte on
                f.write(secrets.token_urlsafe(50))
        except FileExistsError:
            pass
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = _env_flag("DEBUG")


def _networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """An environment variable's comma list of addresses and CIDRs."""
    try:
        return tuple(ipaddress.ip_network(item, strict=False)
                     for item in _items(os.environ.get(name, "")))
    except ValueError as e:
        raise ValueError(f"{name}: expected addresses or CIDRs, comma-separated ({e})") from None


# Not "*": a Host header of the client's choosing would be trusted in the links the server
# builds. The default serves `make run` on this machine (and the test client's "testserver",
# which Django's test setup adds itself); empty counts as unset.
ALLOWED_HOSTS = _items(os.environ.get("RINGSIDE_ALLOWED_HOSTS") or "localhost,127.0.0.1,[::1]")
# the proxies whose X-Forwarded-For / X-Forwarded-Proto are believed: the web server's
# (services.web_server_command) and the login throttles' (jobs.login.client_address)
TRUSTED_PROXIES = _networks("RINGSIDE_TRUSTED_PROXIES")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "ringside",
    "jobs",
    "monitor",
    "monitor.sinks",
    "hosts",
    "datasets",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "ringside.api_errors.BodyLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "ringside.urls"
ASGI_APPLICATION = "ringside.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [REPO_ROOT / "frontend" / "templates"],
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

DATABASES = {  # an empty DATABASE_URL counts as unset
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'ringside.sqlite3'}",
        conn_max_age=60,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory, for the test database too: the Celery worker of the platform tests
    # is another process and must see the same rows. WAL lets the ingest write while pages read.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test_ringside.sqlite3")}
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    _owner_only(*(Path(f"{name}{suffix}") for name in (DATABASES["default"]["NAME"],
                                                       DATABASES["default"]["TEST"]["NAME"])
                  for suffix in ("", "-wal", "-shm")))
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A pool, not persistent connections: under ASGI each request runs its view in a thread of
    # its own, and a persistent connection stays open with its dead thread until collected (20
    # API clients opened ~90 and exhausted PostgreSQL's 100). A request borrows one of at most
    # `max_size` per process and hands it back when it ends.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": 10}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
_owner_only(VAR_DIR, RUNS_DIR, VAR_DIR / "secret_key")

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# A websocket waits for its group messages in Redis pops that block up to 5 s on the server
# (channels_redis's brpop_timeout), and redis-py's default socket timeout is 5 s too: an idle
# socket's read timed out just before Redis answered, and every idle websocket closed every
# ~5.5 s. A read waits out the pop with room to spare; a Redis gone away still fails at once.
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 15
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL,
                              "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}],
                   "prefix": "ringside:asgi", "capacity": 1000},
    }
}

# Celery: a job's supervisor task runs for as long as the training run, so a task is only
# acknowledged when it ends, is handed back if its worker dies, and a worker takes one at a time.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 7 * 24 * 3600}
CELERY_WORKER_CONCURRENCY = int(os.environ.get("WORKER_CONCURRENCY", "2"))
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "ringside")
# task modules other than the apps' `tasks` (which autodiscovery finds): the export, the
# planner's host calibration and webhook deliveries
CELERY_IMPORTS = ["jobs.exports", "jobs.evaluations", "jobs.calibration", "jobs.webhooks"]

# How long a cancelled engine gets between SIGTERM and SIGKILL.
JOB_CANCEL_GRACE_S = float(os.environ.get("JOB_CANCEL_GRACE_S", "5"))
# How long a running engine gets to act on a cancel command before the SIGTERM.
JOB_CANCEL_COMMAND_WAIT_S = float(os.environ.get("JOB_CANCEL_COMMAND_WAIT_S", "3"))
# A supervisor beats the job row every JOB_HEARTBEAT_S; the reaper (Celery beat, every
# JOB_REAPER_INTERVAL_S) requeues a job whose beat is older than JOB_HEARTBEAT_TIMEOUT_S. With
# these defaults a lost worker's job is requeued within 40 s (issue 8: resumed within 60 s).
JOB_HEARTBEAT_S = float(os.environ.get("JOB_HEARTBEAT_S", "5"))
JOB_HEARTBEAT_TIMEOUT_S = float(os.environ.get("JOB_HEARTBEAT_TIMEOUT_S", "30"))
JOB_REAPER_INTERVAL_S = float(os.environ.get("JOB_REAPER_INTERVAL_S", "10"))
# How long a warm pause (`pause` with `{"mode": "warm"}`) keeps the ranks and the worker's
# slots before it turns cold (checkpoint, stop); a pause's own `max_s` overrides it.
JOB_WARM_PAUSE_MAX_S = float(os.environ.get("JOB_WARM_PAUSE_MAX_S", "600"))
# The host registry (hosts app): a worker beats its Host row every HOST_BEAT_S; a host without
# a beat for HOST_LOST_AFTER_S is lost (no placements; its jobs move).
HOST_BEAT_S = float(os.environ.get("HOST_BEAT_S", "5"))
HOST_LOST_AFTER_S = float(os.environ.get("HOST_LOST_AFTER_S", "30"))
RINGSIDE_HOST_NAME = os.environ.get("RINGSIDE_HOST_NAME") or socket.gethostname()
# empty: hosts.registry.host_address() finds the interface that reaches Redis, when a worker
# starts (not here: every web process would resolve the Redis host at import)
RINGSIDE_HOST_ADDRESS = os.environ.get("RINGSIDE_HOST_ADDRESS", "")
WORKER_SLOTS = int(os.environ["WORKER_SLOTS"]) if os.environ.get("WORKER_SLOTS") else None
WORKER_LABELS = _labels(os.environ.get("WORKER_LABELS", ""))
# Each host's part of a job on several hosts beats its reservation every PART_BEAT_S and
# watches the others': one silent for PART_SILENT_AFTER_S, or that never beat within
# PART_START_TIMEOUT_S of the launch, is a lost host and the job moves to the others
# (jobs.membership).
PART_BEAT_S = float(os.environ.get("PART_BEAT_S", "1"))
# what places and launches a job that names no backend (jobs.backends): "hosts" or "slurm"
BACKEND = os.environ.get("RINGSIDE_BACKEND", "hosts")
# a worker with Slurm's clients (a login node) supervises Slurm jobs: it consumes their queue
SLURM_SUBMIT = os.environ.get("RINGSIDE_SLURM_SUBMIT", "") == "1"
SLURM_QUEUE = "slurm"
# the Redis the cluster's nodes publish to (the platform's own, as the nodes reach it)
SLURM_BUS_URL = os.environ.get("RINGSIDE_SLURM_BUS_URL", "")
SLURM_POLL_S = float(os.environ.get("RINGSIDE_SLURM_POLL_S", "1"))
# Slurm warns the job this long before its time limit (SIGUSR1): the engine checkpoints
SLURM_SIGNAL_LEAD_S = int(os.environ.get("RINGSIDE_SLURM_SIGNAL_LEAD_S", "60"))
# Slurm through its REST API (jobs.backends.slurm_rest) instead of its clients, where set:
# slurmrestd's http://host:port, the Slurm user the jobs run as, and a JWT for that user
# (`scontrol token username=<user> lifespan=<s>`: renew it, and restart, before it expires)
SLURMRESTD_URL = os.environ.get("RINGSIDE_SLURMRESTD_URL", "")
SLURMRESTD_USER = os.environ.get("RINGSIDE_SLURMRESTD_USER", "")
SLURMRESTD_TOKEN = os.environ.get("RINGSIDE_SLURMRESTD_TOKEN", "")
# how long after a node fell silent Slurm may still be finding out (twice its SlurmdTimeout
# plus MessageTimeout): slurmrestd does not show the configuration; 0: from Slurm's defaults
SLURM_NODE_DOWN_WITHIN_S = float(os.environ.get("RINGSIDE_SLURM_NODE_DOWN_WITHIN_S", "0"))
PART_SILENT_AFTER_S = float(os.environ.get("PART_SILENT_AFTER_S", "5"))
PART_START_TIMEOUT_S = float(os.environ.get("PART_START_TIMEOUT_S", "60"))

# Placement (jobs.placement): a waiting job's effective priority grows by one every
# SCHEDULER_AGING_S seconds it waits, so that none starves behind higher priorities
SCHEDULER_AGING_S = float(os.environ.get("SCHEDULER_AGING_S", "300"))
# A placed job whose supervisor has not started it within this long loses its reservations
# (jobs.placement.release_orphans) and is placed again
JOB_PLACEMENT_START_TIMEOUT_S = float(os.environ.get("JOB_PLACEMENT_START_TIMEOUT_S", "60"))

CELERY_BEAT_SCHEDULE = {
    "reap-lost-supervisors": {"task": "jobs.tasks.reap", "schedule": JOB_REAPER_INTERVAL_S,
                              "options": {"expires": JOB_REAPER_INTERVAL_S}},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# named API tokens a user may create in any hour (jobs.permissions.token_creation_wait)
API_TOKENS_PER_HOUR = int(os.environ.get("API_TOKENS_PER_HOUR", "20"))
WEBHOOK_TIMEOUT_S = float(os.environ.get("WEBHOOK_TIMEOUT_S", "3"))
# Webhook receivers must be public addresses (common.addresses), except inside these CIDRs:
# the operator's own receivers on an internal network
RINGSIDE_WEBHOOK_ALLOW = _networks("RINGSIDE_WEBHOOK_ALLOW")
RINGSIDE_WEBHOOKS_PER_USER = int(os.environ.get("RINGSIDE_WEBHOOKS_PER_USER", "20"))
# Metric sinks (monitor.sinks): the operator's MLflow tracking server, used by an `mlflow` sink
# that names none (trusted: it may sit on an internal address); how long a job's sinks get to
# catch up once its engine exited before a Celery task takes over (RINGSIDE_SINK_DRAIN_S), how
# often a sink writes what came (RINGSIDE_SINK_INTERVAL_S), and the longest wait between tries
# at an unreachable tracker
RINGSIDE_MLFLOW_TRACKING_URI = os.environ.get("RINGSIDE_MLFLOW_TRACKING_URI", "")
RINGSIDE_SINK_DRAIN_S = float(os.environ.get("RINGSIDE_SINK_DRAIN_S", "10"))
RINGSIDE_SINK_INTERVAL_S = float(os.environ.get("RINGSIDE_SINK_INTERVAL_S", "2"))
RINGSIDE_SINK_RETRY_MAX_S = float(os.environ.get("RINGSIDE_SINK_RETRY_MAX_S", "30"))
# a delivery (a Celery task, jobs.webhooks) is tried up to WEBHOOK_ATTEMPTS times while the
# receiver is unreachable or answers 5xx/429; the n-th retry waits WEBHOOK_RETRY_S * 2**(n-1)
WEBHOOK_ATTEMPTS = int(os.environ.get("WEBHOOK_ATTEMPTS", "4"))
WEBHOOK_RETRY_S = float(os.environ.get("WEBHOOK_RETRY_S", "10"))

# What one user may take of a shared server (jobs.admission, jobs.models.Quota: staff set a
# user's own limits in the admin; these are the defaults; 0: no limit): jobs queued or running
# at once, slots held at once, bytes of checkpoints still stored
RINGSIDE_QUOTA_JOBS = int(os.environ.get("RINGSIDE_QUOTA_JOBS", "20"))
RINGSIDE_QUOTA_SLOTS = int(os.environ.get("RINGSIDE_QUOTA_SLOTS", "0"))
RINGSIDE_QUOTA_CHECKPOINT_BYTES = int(os.environ.get("RINGSIDE_QUOTA_CHECKPOINT_BYTES", "0"))
# the highest placement priority a user who is not staff may ask for
RINGSIDE_MAX_USER_PRIORITY = int(os.environ.get("RINGSIDE_MAX_USER_PRIORITY", "0"))
# API bodies: their size (Django's setting, also the JSON parser's bound on a body without a
# Content-Length) and how deep their JSON may nest (common.parsers)
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("RINGSIDE_MAX_BODY_BYTES", str(2_621_440)))
RINGSIDE_JSON_MAX_DEPTH = int(os.environ.get("RINGSIDE_JSON_MAX_DEPTH", "32"))

# Only the login throttles' counters live here. On disk, so that every web process of the
# host (WEB_PROCESSES of them) counts into the same ones; Django's default, a per-process
# memory cache, would let each process allow the whole rate.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                      "LOCATION": VAR_DIR / "cache"}}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "jobs.permissions.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # password attempts (jobs.login): per client address and per username, counted in the
    # default cache
    "DEFAULT_THROTTLE_RATES": {
        "login": os.environ.get("THROTTLE_LOGIN", "20/minute"),
        "login_account": os.environ.get("THROTTLE_LOGIN_ACCOUNT", "10/minute"),
    },
    # any other throttle's client address is the connection's: DRF's default, None, took any
    # X-Forwarded-For a client chose to send. The login throttles believe the header from
    # TRUSTED_PROXIES only (jobs.login.client_address).
    "NUM_PROXIES": 0,
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "jobs.pagination.Pagination",
    "DEFAULT_PARSER_CLASSES": ["common.parsers.BoundedJSONParser",
                               "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    # \uXXXX escapes for what is not ASCII: a lone surrogate a row holds (older code stored
    # them) then renders as its escape instead of failing the answer's UTF-8 encoding
    "UNICODE_JSON": False,
    # JSON 415 naming the type to use (and DRF's own answers otherwise)
    "EXCEPTION_HANDLER": "ringside.api_errors.exception_handler",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Ringside API",
    "DESCRIPTION": "Launch, watch and steer Mixture-of-Experts training jobs.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {"JobStateEnum": "jobs.models.State",
                            "DatasetStateEnum": "datasets.models.DatasetState",
                            "SinkStateEnum": "monitor.sinks.models.SinkState",
                            # an export's and an evaluation's (a worker's task)
                            "ExportStateEnum": "jobs.models.ExportState"},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = REPO_ROOT / "staticfiles"
STATICFILES_DIRS = [
    REPO_ROOT / "frontend" / "static",
    ("plotly", Path(plotly.__file__).parent / "package_data"),
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}
