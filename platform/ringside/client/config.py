"""Where the client finds its server and token: the stored credentials file, overridden by
`RINGSIDE_URL` / `RINGSIDE_TOKEN`, overridden by `--url`.

The file keeps one token per server URL (`{"url": <last logged in>, "tokens": {url: token}}`),
so `--url` against another server picks that server's token instead of sending this one's.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://localhost:8000"
FILE_NAME = "credentials.json"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "ringside"


def credentials_path() -> Path:
    return config_dir() / FILE_NAME


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str | None


def _stored() -> dict:
    try:
        data = json.loads(credentials_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def normalise(url: str) -> str:
    return url.rstrip("/")


def load(url: str | None = None) -> Credentials:
    """The server and token to use; `url` is the command line's `--url`."""
    stored = _stored()
    chosen = normalise(url or os.environ.get("RINGSIDE_URL") or stored.get("url") or DEFAULT_URL)
    token = os.environ.get("RINGSIDE_TOKEN") or stored.get("tokens", {}).get(chosen)
    return Credentials(chosen, token)


def save(url: str, token: str) -> Path:
    """Store `token` for `url` (and make `url` the default), readable by this user only."""
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    stored = _stored()
    url = normalise(url)
    stored = {"url": url, "tokens": {**stored.get("tokens", {}), url: token}}
    # mkstemp creates the file 0600, so the token is never readable by others, not even
    # between the write and the rename; the rename keeps a crash from truncating the file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(stored, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
