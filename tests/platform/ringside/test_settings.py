"""What the settings make of a fresh or an old var/ and runs/ (owner-only), of the host names
the server answers to, and of the trusted proxies, read in a platform process of their own."""

import json
import os
import subprocess
import sys

import pytest
from django.test import Client

from common.services import PLATFORM_SECRETS, REPO_ROOT, child_env

# a platform process: creates the database (WAL: -wal and -shm while it is open) and a job's
# run folder and file, and reports the modes of what exists, its hosts and its proxies
SCRIPT = """
import json, os, django
django.setup()
from django.conf import settings
from django.db import connection
connection.cursor().execute("CREATE TABLE IF NOT EXISTS t (x int)")
connection.cursor().execute("INSERT INTO t VALUES (1)")
job = settings.RUNS_DIR / "1"
job.mkdir(parents=True, exist_ok=True)
(job / "spec.json").write_text("{}")
paths = [settings.VAR_DIR, settings.VAR_DIR / "secret_key", settings.RUNS_DIR, job,
         job / "spec.json", *(f"{settings.DATABASES['default']['NAME']}{s}"
                              for s in ("", "-wal", "-shm"))]
print(json.dumps({"modes": {os.path.basename(p): oct(os.stat(p).st_mode & 0o777)
                            for p in paths},
                  "hosts": settings.ALLOWED_HOSTS,
                  "proxies": [str(n) for n in settings.TRUSTED_PROXIES]}))
"""


def platform_process(var_dir, **env: str) -> subprocess.CompletedProcess:
    environment = child_env(RINGSIDE_VAR_DIR=str(var_dir), RUNS_DIR=str(var_dir / "runs"),
                            **env)
    for name in (*PLATFORM_SECRETS, "RINGSIDE_ALLOWED_HOSTS", "RINGSIDE_TRUSTED_PROXIES"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=environment, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def report(var_dir, **env: str) -> dict:
    done = platform_process(var_dir, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


OWNER_ONLY = {"var": "0o700", "secret_key": "0o600", "runs": "0o700", "1": "0o700",
              "spec.json": "0o600", "ringside.sqlite3": "0o600",
              "ringside.sqlite3-wal": "0o600", "ringside.sqlite3-shm": "0o600"}


def test_a_fresh_var_database_and_runs_are_the_owners_only(tmp_path):
    # what a shell usually hands down: the platform must not rely on a stricter one
    previous = os.umask(0o022)
    try:
        found = report(tmp_path / "var")
    finally:
        os.umask(previous)
    assert found["modes"] == OWNER_ONLY


def test_what_an_older_version_left_readable_is_made_owner_only_at_start(tmp_path):
    var = tmp_path / "var"
    (var / "runs").mkdir(parents=True)
    for path, mode in ((var, 0o755), (var / "runs", 0o755)):
        path.chmod(mode)
    for name in ("secret_key", "ringside.sqlite3"):
        (var / name).write_text("old-secret-key" if name == "secret_key" else "")
        (var / name).chmod(0o644)
    modes = report(var)["modes"]
    assert (modes["var"], modes["runs"], modes["secret_key"], modes["ringside.sqlite3"]) == (
        "0o700", "0o700", "0o600", "0o600")


def test_the_server_answers_to_local_names_unless_told_others(tmp_path):
    assert report(tmp_path / "a")["hosts"] == ["localhost", "127.0.0.1", "[::1]"]
    named = report(tmp_path / "b", RINGSIDE_ALLOWED_HOSTS="ringside.example.org, 10.1.2.3")
    assert named["hosts"] == ["ringside.example.org", "10.1.2.3"]


@pytest.mark.django_db
def test_a_request_for_a_host_not_allowed_is_refused():
    assert Client().get("/login/", HTTP_HOST="attacker.example").status_code == 400
    assert Client().get("/login/", HTTP_HOST="localhost:8000").status_code == 200


def test_trusted_proxies_are_addresses_and_cidrs_and_a_bad_one_names_the_variable(tmp_path):
    trusted = report(tmp_path / "a", RINGSIDE_TRUSTED_PROXIES="10.0.0.1, 172.16.0.0/12, ::1")
    assert trusted["proxies"] == ["10.0.0.1/32", "172.16.0.0/12", "::1/128"]
    bad = platform_process(tmp_path / "b", RINGSIDE_TRUSTED_PROXIES="10.0.0.1, proxy.local")
    assert bad.returncode != 0
    assert "RINGSIDE_TRUSTED_PROXIES: expected addresses or CIDRs" in bad.stderr
