"""S3 for the tests: a real S3-protocol server (moto's, in this process) on 127.0.0.1, reached by s3fs in this
process and in the jobs the tests launch. A pytest plugin (``tests/conftest.py`` loads it): its fixtures are shared.

- ``s3_bucket``: a fresh bucket; every ``s3://`` access of this process (fsspec, s3fs, Lightning) goes to the server,
  and ``s3_job_env()`` gives the environment that sends a launched job's there too.
- ``s3_outage``: a bucket behind a ``TcpProxy`` the test can cut and restore, with clients that give up quickly.
- ``closed_port``: a 127.0.0.1 port that refuses connections.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import fsspec
import pytest

from lightning_scale import knobs
from tests.tcp_proxy import TcpProxy

_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def s3_job_env(endpoint_url: str, tmp_path) -> dict[str, str]:
    """Environment variables that send every ``s3://`` access of a launched process to ``endpoint_url`` (fsspec reads
    ``FSSPEC_S3_ENDPOINT_URL`` when it is imported), with the test credentials and no AWS config of the machine."""
    return {
        **_CREDENTIALS,
        "FSSPEC_S3_ENDPOINT_URL": endpoint_url,
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def _point_s3_at(monkeypatch, tmp_path, endpoint_url, **s3_kwargs):
    """Send every s3:// access of fsspec, s3fs and Lightning in this process to ``endpoint_url``, for one test.

    ``FSSPEC_S3_ENDPOINT_URL`` is read only when fsspec is imported, so the endpoint goes into fsspec's config dict,
    which every ``S3FileSystem`` (ours and Lightning's) is built from.
    """
    import s3fs

    for name, value in s3_job_env(endpoint_url, tmp_path).items():
        if name != "FSSPEC_S3_ENDPOINT_URL":
            monkeypatch.setenv(name, value)
    for name in ["AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint_url, **s3_kwargs})
    s3fs.S3FileSystem.clear_instance_cache()


@contextmanager
def _moto_server() -> Iterator[int]:
    """A moto S3 server on 127.0.0.1 for the duration; yields its port."""
    moto_server = pytest.importorskip("moto.server")
    import s3fs

    werkzeug_log = logging.getLogger("werkzeug")
    werkzeug_level = werkzeug_log.level
    werkzeug_log.setLevel(logging.WARNING)  # no log line per request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield server.get_host_and_port()[1]
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
        werkzeug_log.setLevel(werkzeug_level)


def _new_bucket() -> str:
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3").mkdir(bucket)
    return bucket


@pytest.fixture
def s3_endpoint(monkeypatch, tmp_path) -> Iterator[str]:
    """The URL of a fresh moto S3 server that every ``s3://`` access of this process goes to."""
    with _moto_server() as port:
        endpoint = f"http://127.0.0.1:{port}"
        _point_s3_at(monkeypatch, tmp_path, endpoint)
        yield endpoint


@pytest.fixture
def s3_bucket(s3_endpoint) -> str:
    """A fresh bucket on the ``s3_endpoint`` server; its name."""
    return _new_bucket()


@pytest.fixture
def closed_port():
    """A 127.0.0.1 port that refuses connections (bound, never listening) for the duration of the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def unreachable_s3(monkeypatch, tmp_path, closed_port):
    """s3:// pointed at a closed 127.0.0.1 port, with one attempt and short timeouts so failures take seconds."""
    import s3fs

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    _point_s3_at(
        monkeypatch,
        tmp_path,
        f"http://127.0.0.1:{closed_port}",
        config_kwargs={"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 1}},
    )
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_outage(monkeypatch, tmp_path):
    """A bucket on a moto server reached through a ``TcpProxy`` that the test can cut and restore.

    Clients give up quickly (one attempt per request, short timeouts, a 20 s deadline per storage call),
    ``ResumableCheckpoint`` retries each upload twice more 0.3 s and 0.6 s later, and uploads go in 5 MiB parts.
    Yields ``(proxy, bucket, s3 client)``, the client talking to the server directly (not through the proxy).
    """
    import boto3
    import s3fs

    monkeypatch.setattr(knobs, "STORAGE_ATTEMPTS", 3)
    monkeypatch.setattr(knobs, "STORAGE_BACKOFF_S", 0.3)
    monkeypatch.setattr(knobs, "UPLOAD_PART_BYTES", 5 * 2**20)
    monkeypatch.setattr(knobs, "STORAGE_CALL_TIMEOUT_S", 20.0)  # a call stuck on a dead connection is retried soon
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    with _moto_server() as port:
        proxy = TcpProxy(port)
        try:
            fast = {"connect_timeout": 1, "read_timeout": 5, "retries": {"max_attempts": 1, "mode": "standard"}}
            _point_s3_at(monkeypatch, tmp_path, f"http://127.0.0.1:{proxy.port}", config_kwargs=fast)
            client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
            yield proxy, _new_bucket(), client
        finally:
            proxy.close()
