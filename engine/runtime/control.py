"""The control channel: commands a person (or the platform) sends to a running job.

A command is an `engine.contract.Command`, `{id, kind, args}`. Rank 0 reads them at step
boundaries without ever blocking a step: from the Redis stream `control_stream(job)` when the
job runs on the bus, else from the JSONL file `<run dir>/control.jsonl` (append a line to
steer a command-line run). The training loop broadcasts what rank 0 read so every
rank acts at the same step, and acknowledges each command id with an `action` event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.contract import Command, ContractError, control_stream
from engine.runtime.events import BusOutage, bus_client, bus_unreachable


class ControlChannel:
    """Rank 0's reader of a job's commands; `poll()` returns what arrived since last time."""

    def __init__(self, job: str, run_dir: Path, bus_url: str | None = None):
        self.job = job
        self.errors: list[str] = []  # malformed commands, reported by the loop
        self._redis = None
        self._outage = BusOutage(job, "commands wait in the stream for its return")
        self._last_id = "0-0"
        self._seen: set[str] = set()  # command ids read so far
        self._file = run_dir / "control.jsonl"
        self._file_offset = self._file.stat().st_size if self._file.exists() else 0
        if bus_url:
            self._redis = bus_client(bus_url)
            # commands sent before this incarnation started were answered by an earlier one
            # or are meant for it (a relaunch after pause reads the stream from its end)
            newest = self._redis.xrevrange(control_stream(job), count=1)
            if newest:
                self._last_id = newest[0][0].decode()

    def poll(self) -> list[Command]:
        """The commands that arrived since the last poll, each id once: the platform may
        deliver a command again when it cannot tell whether the first delivery went out."""
        raw = self._poll_redis() if self._redis is not None else self._poll_file()
        commands = []
        for item in raw:
            try:
                command = Command.from_dict(item)
            except ContractError as e:
                self.errors.append(str(e))
                continue
            if command.id not in self._seen:
                self._seen.add(command.id)
                commands.append(command)
        return commands

    def _poll_redis(self) -> list[Any]:
        if not self._outage.may_try():
            return []
        try:
            found = self._redis.xread({control_stream(self.job): self._last_id}, count=32)
        except Exception as error:
            if not bus_unreachable(error):
                raise
            self._outage.failed(error)
            return []
        self._outage.succeeded()
        items = []
        for _, entries in found:
            for entry_id, fields in entries:
                self._last_id = entry_id.decode()
                try:
                    item = json.loads(fields[b"command"])
                except (KeyError, ValueError):
                    self.errors.append(f"command {self._last_id}: not a JSON 'command' field")
                    continue
                item.setdefault("id", self._last_id)
                items.append(item)
        return items

    def _poll_file(self) -> list[Any]:
        if not self._file.exists():
            return []
        with self._file.open("rb") as f:
            f.seek(self._file_offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        self._file_offset += len(complete)
        items = []
        for n, line in enumerate(complete.decode("utf-8", errors="replace").splitlines()):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                self.errors.append(f"command: not JSON: {line[:80]!r}")
                continue
            if isinstance(item, dict):
                item.setdefault("id", f"file-{self._file_offset}-{n}")
            items.append(item)
        return items

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()


def send(job: str, kind: str, args: dict[str, Any] | None = None, *, bus_url: str | None = None,
         run_dir: Path | None = None, command_id: str = "") -> None:
    """Append a command for a job, on the bus or in its run folder's control file."""
    command = {"kind": kind, "args": args or {}}
    if command_id:
        command["id"] = command_id
    if bus_url:
        import redis

        client = redis.Redis.from_url(bus_url)
        client.xadd(control_stream(job), {"command": json.dumps(command)})
        client.close()
    elif run_dir is not None:
        with (run_dir / "control.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(command) + "\n")
    else:
        raise ValueError("send: give bus_url or run_dir")
