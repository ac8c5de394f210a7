"""Notice sources against real loopback servers that speak each provider's metadata protocol (127.0.0.1 only)."""

from __future__ import annotations

import datetime
import email.utils
import functools
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

import pytest

from lightning_scale.preemption import (
    AWSSpotNotice,
    AzureScheduledEvents,
    FileNotice,
    GCPPreemptionNotice,
    NoticeSource,
    SignalNotice,
)

FAST = 0.05  # poll_interval for every source under test


class Request(NamedTuple):
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


class Loopback:
    """A real HTTP server on 127.0.0.1; ``respond(request) -> (status, body)`` decides every answer."""

    def __init__(self, respond: Callable[[Request], tuple[int, bytes]], port: int = 0) -> None:
        self.requests: list[Request] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                outer.requests.append(request)
                status, payload = respond(request)
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_POST = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def count(self, method: str, path: str) -> int:
        return sum(r.method == method and r.path == path for r in self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeIMDS:
    """EC2 IMDSv2: a token from ``PUT /latest/api/token`` must accompany ``GET .../spot/instance-action``."""

    source, cls, get_path = "aws", AWSSpotNotice, "/latest/meta-data/spot/instance-action"

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.action: dict | None = None

    def schedule(self, when: str = "2026-12-02T15:00:00Z") -> None:
        self.action = {"action": "terminate", "time": when}

    def __call__(self, req: Request) -> tuple[int, bytes]:
        if req.method == "PUT" and req.path == "/latest/api/token":
            if "x-aws-ec2-metadata-token-ttl-seconds" not in req.headers:
                return 400, b""
            token = f"token-{len(self.tokens)}-{time.monotonic_ns()}"
            self.tokens.add(token)
            return 200, token.encode()
        if req.method == "GET" and req.path == self.get_path:
            if req.headers.get("x-aws-ec2-metadata-token") not in self.tokens:
                return 401, b""
            return (404, b"Not Found") if self.action is None else (200, json.dumps(self.action).encode())
        return 404, b""


class FakeGCP:
    """GCP metadata server: ``instance/preempted`` needs ``Metadata-Flavor: Google``; ``FALSE`` then ``TRUE``."""

    source, cls, get_path = "gcp", GCPPreemptionNotice, "/computeMetadata/v1/instance/preempted"

    def __init__(self) -> None:
        self.preempted = False

    def schedule(self) -> None:
        self.preempted = True

    def __call__(self, req: Request) -> tuple[int, bytes]:
        if req.headers.get("metadata-flavor") != "Google":
            return 403, b""
        if req.method == "GET" and req.path == self.get_path:
            return 200, b"TRUE" if self.preempted else b"FALSE"
        return 404, b""


class FakeAzure:
    """Azure Scheduled Events: needs ``Metadata: true``; GET lists events, POST records ``StartRequests``."""

    source, cls, get_path = "azure", AzureScheduledEvents, "/metadata/scheduledevents?api-version=2020-07-01"

    def __init__(self) -> None:
        self.events: list[dict] = []

    def add_event(self, event_type: str, event_id: str = "A1B2", not_before: float | None = None) -> None:
        not_before = time.time() + 60 if not_before is None else not_before
        when = email.utils.formatdate(not_before, usegmt=True)
        event = {"EventId": event_id, "EventType": event_type, "ResourceType": "VirtualMachine", "Resources": ["vm1"]}
        self.events.append({**event, "EventStatus": "Scheduled", "NotBefore": when})

    def schedule(self) -> None:
        self.add_event("Preempt")

    def __call__(self, req: Request) -> tuple[int, bytes]:
        if req.headers.get("metadata") != "true" or req.path != self.get_path:
            return 400, b""
        if req.method == "POST":
            return 200, b""
        return 200, json.dumps({"DocumentIncarnation": 1 + len(self.events), "Events": self.events}).encode()


FAKES = [FakeIMDS, FakeGCP, FakeAzure]


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> object:
    """The first truthy value of ``predicate()``, polled every 10 ms; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.01)
    raise AssertionError(f"condition not met within {timeout} s")


def preemption_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """Messages of the warnings raised by lightning_scale (the polling thread's) or mentioning a preemption check."""
    return [str(w.message) for w in caught if "lightning_scale" in w.filename or "preemption" in str(w.message)]


def assert_one_warning(caught: list[warnings.WarningMessage], source: str) -> str:
    messages = preemption_warnings(caught)
    assert len(messages) == 1, f"expected exactly one warning from {source}, got {messages}"
    assert messages[0].startswith(f"{source} ") and "still polling" in messages[0], messages[0]
    return messages[0]


@pytest.fixture
def caught():
    """Every warning, repeats included (the ``recwarn`` fixture uses the 'default' action, which hides repeats)."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        yield records


@pytest.fixture
def serve():
    """``serve(respond, port=0) -> Loopback``; every server is shut down at teardown."""
    servers: list[Loopback] = []

    def _serve(respond: Callable[[Request], tuple[int, bytes]], port: int = 0) -> Loopback:
        servers.append(Loopback(respond, port))
        return servers[-1]

    yield _serve
    for server in servers:
        server.close()


@pytest.fixture
def running(caught):
    """``running(source)`` starts it; teardown stops it (before ``caught`` stops recording its warnings)."""
    sources: list = []

    def _start(source):
        source.start()
        sources.append(source)
        return source

    yield _start
    for source in sources:
        source.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_aws_none_while_404_then_notice_with_parsed_deadline(serve, running, caught):
    imds = FakeIMDS()
    server = serve(imds)
    source = running(AWSSpotNotice(base_url=server.url, poll_interval=FAST))
    wait_for(lambda: server.count("GET", imds.get_path) >= 3)
    assert source.poll() is None
    assert server.count("PUT", "/latest/api/token") == 1  # one token, reused
    imds.schedule("2026-12-02T15:00:00Z")
    notice = wait_for(source.poll, timeout=2.0)
    assert notice.source == "aws"
    assert notice.deadline_unix == datetime.datetime(2026, 12, 2, 15, tzinfo=datetime.timezone.utc).timestamp()
    assert "terminate" in notice.detail
    gets = [r for r in server.requests if r.method == "GET"]
    assert all(r.headers["x-aws-ec2-metadata-token"] in imds.tokens for r in gets)
    assert preemption_warnings(caught) == []
    source.stop()
    source.stop()  # safe twice


def test_aws_get_without_token_is_refused_and_source_recovers_from_revoked_token(serve, running, caught):
    imds = FakeIMDS()
    server = serve(imds)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server.url + imds.get_path, timeout=2)
    assert refused.value.code == 401
    source = running(AWSSpotNotice(base_url=server.url, poll_interval=FAST))
    wait_for(lambda: server.count("GET", imds.get_path) >= 3)  # the refused probe above, then the source's
    assert server.count("PUT", "/latest/api/token") == 1
    imds.tokens.clear()  # revoke once: the next GET gets 401
    wait_for(lambda: server.count("PUT", "/latest/api/token") == 2)
    imds.schedule()
    assert wait_for(source.poll).source == "aws"
    assert server.count("PUT", "/latest/api/token") == 2
    assert "401" in assert_one_warning(caught, "aws")


@pytest.mark.parametrize("fake", FAKES, ids=lambda f: f.source)
def test_constructed_but_not_started_makes_no_request(serve, fake):
    server = serve(fake())
    source = fake.cls(base_url=server.url, poll_interval=FAST)
    assert source.poll() is None
    time.sleep(0.3)
    assert server.requests == []
    source.stop()  # stop without start is safe


def test_gcp_false_then_true_gives_notice_with_grace(serve, running, caught):
    gcp = FakeGCP()
    server = serve(gcp)
    source = running(GCPPreemptionNotice(base_url=server.url, poll_interval=FAST, grace_seconds=30))
    wait_for(lambda: server.count("GET", gcp.get_path) >= 3)
    assert source.poll() is None
    before = time.time()
    gcp.schedule()
    notice = wait_for(source.poll)
    assert notice.source == "gcp"
    assert before <= notice.received_unix <= time.time()
    assert notice.deadline_unix == pytest.approx(notice.received_unix + 30)
    assert all(r.headers["metadata-flavor"] == "Google" for r in server.requests)
    assert preemption_warnings(caught) == []


def test_azure_ignores_other_events_then_preempt_gives_notice_and_acknowledge_posts(serve, running, caught):
    azure = FakeAzure()
    server = serve(azure)
    source = running(AzureScheduledEvents(base_url=server.url, poll_interval=FAST))
    wait_for(lambda: server.count("GET", azure.get_path) >= 2)  # {"Events": []}
    azure.add_event("Reboot", event_id="R1")
    seen = server.count("GET", azure.get_path)
    wait_for(lambda: server.count("GET", azure.get_path) >= seen + 3)
    assert source.poll() is None  # a Reboot is not a preemption
    not_before = int(time.time()) + 60
    azure.add_event("Preempt", event_id="A1B2", not_before=not_before)
    notice = wait_for(source.poll)
    assert notice.source == "azure" and "A1B2" in notice.detail
    assert notice.deadline_unix == not_before
    source.acknowledge(notice)
    [post] = [r for r in server.requests if r.method == "POST"]
    assert post.path == azure.get_path and post.headers["metadata"] == "true"
    assert json.loads(post.body) == {"StartRequests": [{"EventId": "A1B2"}]}
    assert preemption_warnings(caught) == []


FAILURES = {
    "not-json": (200, b"<html>captive portal</html>"),
    "unexpected-json": (200, b'{"error": "not a metadata server"}'),
    "http-500": (500, b"oops"),
}


@pytest.mark.parametrize("fake", FAKES, ids=lambda f: f.source)
@pytest.mark.parametrize("failure", FAILURES)
def test_bad_answers_warn_once_and_polling_continues(serve, running, caught, fake, failure):
    provider, broken = fake(), [True]
    server = serve(lambda req: FAILURES[failure] if broken[0] else provider(req))
    source = running(fake.cls(base_url=server.url, poll_interval=FAST))
    wait_for(lambda: len(server.requests) >= 4)
    assert source.poll() is None
    broken[0] = False
    provider.schedule()
    assert wait_for(source.poll).source == fake.source
    assert_one_warning(caught, fake.source)


@pytest.mark.parametrize("fake", FAKES, ids=lambda f: f.source)
def test_unreachable_endpoint_warns_once_then_notice_once_server_appears(serve, running, caught, fake):
    port = free_port()
    source = running(fake.cls(base_url=f"http://127.0.0.1:{port}", poll_interval=FAST))
    wait_for(lambda: preemption_warnings(caught))
    time.sleep(5 * FAST)  # several more failed polls
    assert source.poll() is None
    provider = fake()
    provider.schedule()
    server = serve(provider, port=port)
    assert wait_for(source.poll).source == fake.source
    assert server.requests
    assert_one_warning(caught, fake.source)


def test_signal_notice_records_signal_and_restores_previous_handler(running):
    previous = signal.getsignal(signal.SIGUSR1)
    source = SignalNotice(signals=("SIGUSR1",), grace_seconds=20)
    assert signal.getsignal(signal.SIGUSR1) is previous  # nothing installed before start
    running(source)
    assert signal.getsignal(signal.SIGUSR1) is not previous
    assert source.poll() is None
    before = time.time()
    os.kill(os.getpid(), signal.SIGUSR1)
    notice = wait_for(source.poll)
    assert notice.source == "SIGUSR1"
    assert before <= notice.received_unix <= time.time()
    assert notice.deadline_unix == notice.received_unix + 20
    source.stop()
    source.stop()  # safe twice
    assert signal.getsignal(signal.SIGUSR1) == previous


@pytest.mark.parametrize("signals", [("SIGFOO",), (), ("SIGKILL",)], ids=["unknown", "empty", "SIGKILL"])
def test_signal_notice_rejects_bad_signals_listing_valid_names(signals):
    with pytest.raises(ValueError, match="signals=") as err:
        SignalNotice(signals=signals)
    valid = str(err.value).split("choose from", 1)[1]
    assert "SIGTERM" in valid and "SIGUSR1" in valid
    assert "SIGKILL" not in valid and "SIGSTOP" not in valid


def test_file_notice_absent_then_written(tmp_path, running):
    path = tmp_path / "preempted"
    source = running(FileNotice(str(path), poll_interval=FAST))
    time.sleep(3 * FAST)
    assert source.poll() is None
    staged = tmp_path / "staged"
    staged.write_text("node drained by autoscaler\n")
    staged.replace(path)  # appear with its text at once
    notice = wait_for(source.poll, timeout=1.0)
    assert notice.source == "file" and notice.detail == "node drained by autoscaler"


MAKERS = {
    "aws": AWSSpotNotice,
    "gcp": GCPPreemptionNotice,
    "azure": AzureScheduledEvents,
    "signal": SignalNotice,
    "file": functools.partial(FileNotice, "/nonexistent"),
}
HTTP = ("aws", "gcp", "azure")
BAD_ARGUMENTS = [
    pytest.param(name, argument, value, id=f"{name}-{argument}={value}")
    for names, argument, values in [
        ((*HTTP, "file"), "poll_interval", (0, -1.0)),
        (HTTP, "base_url", ("169.254.169.254", "ftp://x")),
        (("gcp", "azure", "signal", "file"), "grace_seconds", (0,)),
    ]
    for name in names
    for value in values
]


@pytest.mark.parametrize(("name", "argument", "value"), BAD_ARGUMENTS)
def test_bad_argument_is_rejected_naming_it(name, argument, value):
    with pytest.raises(ValueError, match=f"^{argument}="):
        MAKERS[name](**{argument: value})


@pytest.mark.parametrize("name", MAKERS)
def test_every_source_is_a_notice_source(name):
    assert isinstance(MAKERS[name](), NoticeSource)


def test_file_notice_ignores_a_file_left_from_before_it_started(tmp_path, running):
    path = tmp_path / "notice"
    path.write_text("an earlier attempt's notice")
    os.utime(path, (time.time() - 60, time.time() - 60))
    source = running(FileNotice(str(path), poll_interval=FAST))
    time.sleep(0.3)
    assert source.poll() is None  # a restarted job is not preempted again by the old file
    path.write_text("a new notice")
    wait_for(lambda: source.poll() is not None)
    assert source.poll().detail == "a new notice"


def test_file_notice_told_not_to_ignore_existing_files_takes_one_written_before_it_started(tmp_path, running):
    """The SLURM example deletes the notice when a run starts; its trap may write one before training starts."""
    path = tmp_path / "notice"
    path.write_text("slurm time limit")
    os.utime(path, (time.time() - 60, time.time() - 60))
    source = running(FileNotice(str(path), poll_interval=FAST, ignore_existing=False))
    assert wait_for(source.poll, timeout=1.0).detail == "slurm time limit"
