"""`manage.py serve` (what `make run` runs): starts everything, restarts a dead child, stops
everything on Ctrl-C, and starts again."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from common.services import REPO_ROOT, child_env, wait_for_port
from engine.ports import free_port


class Serve:
    """`manage.py serve` on a fresh SQLite database and its own embedded Redis."""

    def __init__(self, var_dir, port: int):
        env = child_env(RINGSIDE_VAR_DIR=str(var_dir), RUNS_DIR=str(var_dir / "runs"),
                        PORT=str(port), WORKER_CONCURRENCY="1", WEB_PROCESSES="2")
        for name in ("DATABASE_URL", "REDIS_URL", "RINGSIDE_ADMIN_PASSWORD"):
            env.pop(name, None)
        self.port = port
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "manage.py"), "serve"],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            assert self.proc.poll() is None, "serve exited:\n" + "".join(self.lines[-40:])
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} after {timeout} s:\n" + "".join(self.lines[-40:]))

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def token(self, password: str) -> int:
        body = json.dumps({"username": "admin", "password": password}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/auth/token/",
                                         data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            return json.load(r)["token"]

    def stop(self, sig: signal.Signals, timeout: float = 40) -> list[psutil.Process]:
        tree = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(sig)
        self.proc.wait(timeout)
        return tree


@pytest.fixture
def var_dir(tmp_path):
    return tmp_path / "var"


def test_serve_runs_the_platform_restarts_a_dead_child_and_stops_on_ctrl_c(var_dir):
    port = free_port()
    serve = Serve(var_dir, port)
    try:
        password = serve.wait_for(r"Created user 'admin' with password: (\S+)", 60).group(1)
        serve.wait_for(rf"Ringside is up: open http://127.0.0.1:{port}/", 60)
        assert serve.get("/") == 200
        assert serve.get("/static/plotly/plotly.min.js") == 200
        assert len(serve.token(password)) == 40
        commands = [" ".join(p.cmdline()) for p in psutil.Process(serve.proc.pid).children()]
        assert any("celery -A ringside beat" in c for c in commands), commands  # the reaper

        web = next(p for p in psutil.Process(serve.proc.pid).children()
                   if "uvicorn" in " ".join(p.cmdline()))
        assert sum("spawn_main" in " ".join(p.cmdline()) for p in web.children()) == 2
        os.killpg(web.pid, signal.SIGKILL)
        serve.wait_for(r"web exited with code -9; restarting", 10)
        serve.wait_for(r"web restarted", 10)
        wait_for_port(port, 60)
        assert serve.get("/login/") == 200

        children = serve.stop(signal.SIGINT)
        assert serve.proc.returncode == 0
        assert not [p for p in children if p.is_running() and p.status() != "zombie"]
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()

    # a second start reuses the database and the admin's password; SIGTERM stops it too
    again = Serve(var_dir, port)
    try:
        again.wait_for(r"Ringside is up", 60)
        assert not any("Created user" in line for line in again.lines)
        assert len(again.token(password)) == 40
        again.stop(signal.SIGTERM)
        assert again.proc.returncode == 0
    finally:
        if again.proc.poll() is None:
            again.proc.kill()
