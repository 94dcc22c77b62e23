"""`Client`: the REST API and the job websocket of a Ringside server, one method per operation.

Answers are the API's JSON as plain dicts and lists. A refused request raises `ApiError`,
which knows the fields the server named. Every POST carries a fresh `Idempotency-Key`, so the
transport's retry of a request whose connection failed cannot act twice.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from engine.contract import FINAL_STATES, JobState

# a followed job stops being followed in these: it ended, or it waits for a person
SETTLED_STATES = frozenset({*FINAL_STATES, JobState.PAUSED})
RECONNECT_TRIES = 8  # consecutive failed connections before `watch` gives up (about 40 s)


class ApiError(Exception):
    """A request the server refused (or could not be reached for: `status` 0)."""

    def __init__(self, status: int, body: Any, method: str = "", path: str = ""):
        self.status, self.body, self.method, self.path = status, body, method, path
        super().__init__("; ".join(self.messages()))

    def messages(self) -> list[str]:
        """One line per problem, each naming its field where the server named one."""
        body = self.body
        if isinstance(body, dict) and isinstance(body.get("errors"), dict):
            body = body["errors"]  # a job spec's errors: {"train.steps": "must be ..."}
        if isinstance(body, dict) and body:
            return [line for field, value in body.items() for line in _lines(field, value)]
        if self.status == 404:
            # not DRF's JSON 404 (an unknown job): the URL itself is unknown to this server
            return [f"the server has no {self.method} {self.path} (HTTP 404); it may be older "
                    "than this client"]
        text = body.strip() if isinstance(body, str) else ""
        return [f"HTTP {self.status}" + (f": {text[:200]}" if text else "")]


def _lines(field: str, value: Any) -> list[str]:
    if field == "detail":
        return [str(value)]
    if field == "state":  # a 409's companion to its detail
        return [f"(the job is {value})"]
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in _lines(f"{field}.{k}", v)]
    values = value if isinstance(value, list) else [value]
    return [f"{field}: {v}" for v in values]


class Client:
    """A Ringside server at `url`, authenticated with an API `token` (see `login`)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        headers = {"Authorization": f"Token {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                 transport=httpx.HTTPTransport(retries=2))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- HTTP --------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "POST":
            kwargs.setdefault("headers", {})["Idempotency-Key"] = str(uuid.uuid4())
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise ApiError(0, {"detail": f"cannot reach {self.url}: {e}"}, method, path) from e
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.is_error:
            raise ApiError(response.status_code, body, method, path)
        return body

    def _get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params={k: v for k, v in params.items()
                                                  if v is not None})

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._request("POST", path, json=body or {})

    def _all(self, path: str) -> list[dict[str, Any]]:
        """Every row of a paginated list, following its `next` links."""
        rows: list[dict[str, Any]] = []
        page: dict[str, Any] | None = self._get(path, limit=1000)
        while page is not None:
            rows += page["results"]
            page = self._request("GET", page["next"]) if page.get("next") else None
        return rows

    # -- operations --------------------------------------------------------------------------

    def login(self, username: str, password: str) -> str:
        """Exchange a password for the user's API token; this client uses it from now on."""
        self.token = self._post("/api/auth/token/",
                                {"username": username, "password": password})["token"]
        self.http.headers["Authorization"] = f"Token {self.token}"
        return self.token

    def jobs(self, state: list[str] | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Newest first."""
        return self._get("/api/jobs/", state=state or None, limit=limit)["results"]

    def job(self, job_id: int) -> dict[str, Any]:
        return self._get(f"/api/jobs/{job_id}/")

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._post("/api/jobs/", spec)

    def events(self, job_id: int) -> list[dict[str, Any]]:
        """The job's state history, oldest first."""
        return self._all(f"/api/jobs/{job_id}/events/")

    def metrics(self, job_id: int, names: list[str] | None = None, start: int | None = None,
                end: int | None = None, max_points: int | None = None) -> dict[str, Any]:
        """`{name: {"step", "value", "min", "max"}}`, downsampled by the server."""
        return self._get(f"/api/jobs/{job_id}/metrics/", names=",".join(names or []) or None,
                         to=end, max_points=max_points, **{"from": start})["series"]

    def pause(self, job_id: int, warm: bool = False) -> dict[str, Any]:
        """Warm: keep the ranks and their state in memory (a server that knows the mode)."""
        return self._post(f"/api/jobs/{job_id}/pause/", {"mode": "warm"} if warm else None)

    def resume(self, job_id: int) -> dict[str, Any]:
        return self._post(f"/api/jobs/{job_id}/resume/")

    def checkpoint(self, job_id: int) -> dict[str, Any]:
        return self._post(f"/api/jobs/{job_id}/checkpoint/")

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._post(f"/api/jobs/{job_id}/cancel/")

    def rollback(self, job_id: int, step: int | None = None, checkpoint: int | None = None,
                 skip_data: bool = False) -> dict[str, Any]:
        """To the newest checkpoint at or before `step`, or to checkpoint id `checkpoint`."""
        body = {"step": step, "checkpoint": checkpoint, "skip_data": skip_data}
        return self._post(f"/api/jobs/{job_id}/rollback/",
                          {k: v for k, v in body.items() if v is not None})

    def reshard(self, job_id: int, strategy: str, nodes: int,
                procs_per_node: int) -> dict[str, Any]:
        return self._post(f"/api/jobs/{job_id}/reshard/", {
            "strategy": strategy, "nodes": nodes, "procs_per_node": procs_per_node})

    def set(self, job_id: int, values: dict[str, Any]) -> dict[str, Any]:
        """Change settings of a running job, e.g. `{"train.lr": 1e-3}`."""
        return self._post(f"/api/jobs/{job_id}/set/", values)

    def rebalance(self, job_id: int, shares: list[int] | str = "auto") -> dict[str, Any]:
        """The ranks' shares of each step's batch: samples per rank, "auto" or "even"."""
        return self._post(f"/api/jobs/{job_id}/rebalance/", {"shares": shares})

    def clone(self, job_id: int, name: str | None = None,
              checkpoint: int | None = None) -> dict[str, Any]:
        body = {"name": name, "checkpoint": checkpoint}
        return self._post(f"/api/jobs/{job_id}/clone/",
                          {k: v for k, v in body.items() if v is not None})

    def checkpoints(self, job_id: int) -> list[dict[str, Any]]:
        return self._all(f"/api/jobs/{job_id}/checkpoints/")

    def export_checkpoint(self, job_id: int, checkpoint_id: int) -> dict[str, Any]:
        return self._post(f"/api/jobs/{job_id}/checkpoints/{checkpoint_id}/export/")

    def export_of(self, job_id: int, checkpoint_id: int) -> dict[str, Any] | None:
        """The checkpoint's export (its state, folder, error); None if it was never exported."""
        try:
            return self._get(f"/api/jobs/{job_id}/checkpoints/{checkpoint_id}/export/")
        except ApiError as e:
            if e.status == 404 and isinstance(e.body, dict):  # the server's word, not its URLs'
                return None
            raise

    def evaluate_checkpoint(self, job_id: int, checkpoint_id: int, tasks: str = "",
                            heldout_windows: int = 32) -> dict[str, Any]:
        return self._post(f"/api/jobs/{job_id}/checkpoints/{checkpoint_id}/evaluate/",
                          {"tasks": tasks, "heldout_windows": heldout_windows})

    def evaluations(self, job_id: int, checkpoint_id: int) -> list[dict[str, Any]]:
        """The checkpoint's evaluations, oldest first."""
        return self._all(f"/api/jobs/{job_id}/checkpoints/{checkpoint_id}/evaluate/")

    def plan(self, **query: Any) -> dict[str, Any]:
        """The PaRO planner's rows for `preset`, `nodes`, `procs_per_node`, `grad_accum`,
        `collective`, `memory_budget_gb` (each optional)."""
        return self._get("/api/plan/", **query)

    def upload(self, path: Path, name: str | None = None) -> dict[str, Any]:
        """Upload a file into your folder on the server (a data root of your jobs); the
        answer's `path` is what a spec names."""
        with path.open("rb") as f:
            return self._request("POST", "/api/files/", files={"file": (path.name, f)},
                                 data={"name": name} if name else {})

    def files(self) -> list[dict[str, Any]]:
        return self._get("/api/files/")

    def datasets(self) -> list[dict[str, Any]]:
        """Yours and the shared ones, newest first."""
        return self._all("/api/datasets/")

    def dataset_id(self, ref: str) -> int:
        """The id of the dataset `ref` names: an id, or a name (yours before a shared one)."""
        if ref.isdigit():
            return int(ref)
        named = [d for d in self.datasets() if d["name"] == ref]
        if not named:
            raise ApiError(404, {"detail": f"no dataset named {ref!r} of yours or shared"})
        return min(named, key=lambda d: d["shared"])["id"]

    def dataset(self, dataset_id: int) -> dict[str, Any]:
        return self._get(f"/api/datasets/{dataset_id}/")

    def add_dataset(self, body: dict[str, Any]) -> dict[str, Any]:
        """Register a dataset: `name`, `sources` ([{kind, paths, field}]), `tokenizer`,
        `holdout`."""
        return self._post("/api/datasets/", body)

    def prepare_dataset(self, dataset_id: int) -> dict[str, Any]:
        return self._post(f"/api/datasets/{dataset_id}/prepare/")

    # -- the websocket -----------------------------------------------------------------------

    def watch(self, job_id: int, after: int | None = None) -> Iterator[dict[str, Any]]:
        """The job's websocket messages: a snapshot (none when `after` is given), then live
        events. A dropped socket is reconnected with `?after=` the last sequence number
        received, so no event is missed or repeated."""
        failures = 0
        while True:
            try:
                # close_timeout: the server does not answer a client's close frame (it let
                # websockets' default 10 s run out), and the client has nothing left to hear
                with connect(self._socket_url(job_id, after), open_timeout=30,
                             close_timeout=1) as socket:
                    for raw in socket:
                        failures = 0
                        message = json.loads(raw)
                        if message["type"] == "error":
                            raise ApiError(400, {"detail": message["error"]}, "WS", str(job_id))
                        if message["type"] != "job":  # a job message's seq is not ours to hold
                            after = message["seq"]
                        yield message
                error: Exception = ConnectionError("the server closed the socket")
            except InvalidStatus as e:  # refused before the handshake: the token or the job
                raise ApiError(e.response.status_code, {
                    "detail": f"the server refused to stream job {job_id}: not logged in, or "
                              "no such job"}, "WS", str(job_id)) from e
            except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError) as e:
                error = e
            failures += 1
            if failures > RECONNECT_TRIES:
                raise ApiError(0, {"detail": f"lost the stream of job {job_id}: {error}"},
                               "WS", str(job_id)) from error
            time.sleep(min(0.5 * 2 ** failures, 8))

    def wait(self, job_id: int,
             on_message: Callable[[dict[str, Any]], None] | None = None) -> str:
        """Follow the job until it settles (completed, failed, cancelled or paused), handing
        every message to `on_message`; the settled state."""
        with closing(self.watch(job_id)) as messages:  # closed now, not when collected
            for message in messages:
                if on_message is not None:
                    on_message(message)
                if message["type"] in ("snapshot", "job") and message["state"] in SETTLED_STATES:
                    return message["state"]
        raise AssertionError("unreachable: watch() ends only by raising")

    def _socket_url(self, job_id: int, after: int | None) -> str:
        parts = urlsplit(self.url)
        # the consumer takes the token as a query parameter (monitor.consumers)
        query = {"token": self.token or "", **({"after": after} if after is not None else {})}
        return urlunsplit((parts.scheme.replace("http", "ws", 1), parts.netloc,
                           f"{parts.path}/ws/jobs/{job_id}/", urlencode(query), ""))
