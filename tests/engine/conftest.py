"""An S3-compatible object store for the checkpoint and dataset tests: moto's server mode on a
free port, spoken to over real HTTP through s3fs, as an engine on another host would."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest

from engine.ports import free_port

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server for the session; its endpoint and credentials are in the environment
    (where botocore reads them) for this process and the engines it starts. One server per
    session: fsspec caches one filesystem per set of arguments, endpoint read at creation."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {name: os.environ.get(name) for name in [*S3_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """A new, empty bucket of the test's own: `s3://<bucket>`."""
    import fsspec

    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3", use_listings_cache=False).mkdir(name)
    return f"s3://{name}"
