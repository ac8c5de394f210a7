"""The daemon thread that runs a notice source's check, and its HTTP helpers (standard library only)."""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

from lightning_scale import knobs
from lightning_scale._process_local import ProcessLocal
from lightning_scale.errors import ConfigurationError
from lightning_scale.preemption.notice import Notice

__all__ = ["PollingSource", "PollingThread", "http_request", "validate_base_url", "validate_interval"]

log = logging.getLogger(__name__)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # metadata services are link-local: no proxy


def validate_base_url(base_url: str, argument: str = "base_url") -> str:
    """``base_url`` without a trailing slash; ``ValueError`` unless it is an http(s) URL with a host."""
    parsed = urllib.parse.urlparse(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigurationError(f"{argument}={base_url!r} is not an http(s) URL such as 'http://169.254.169.254'.")
    return base_url.rstrip("/")


def validate_interval(value: float, argument: str) -> float:
    """``value`` when it is a positive number of seconds; ``ValueError`` naming ``argument`` otherwise."""
    if not value > 0:
        raise ConfigurationError(f"{argument}={value} must be a positive number of seconds.")
    return float(value)


def http_request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, bytes]:
    """``(status, body)`` of one request, never through a proxy; HTTP errors are returned, network errors raise."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _OPENER.open(request, timeout=knobs.HTTP_TIMEOUT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class PollingThread:
    """Calls ``check`` every ``interval_s`` in a daemon thread until it returns a :class:`Notice`.

    A check that raises is reported once per outage (a warning and a log line) and polling goes on: a flaky or
    malformed metadata endpoint never stops training.
    """

    def __init__(self, name: str, check: Callable[[], Notice | None], interval_s: float) -> None:
        self.name, self.check, self.interval_s = name, check, interval_s
        self.notice: Notice | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"lightning-scale-{self.name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=knobs.HTTP_TIMEOUT_S + self.interval_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set() and self.notice is None:
            try:
                self.notice = self.check()
                self._warned = False  # answered properly: the next outage is reported again
            except Exception as err:  # a notice source must never take training down
                if not self._warned:
                    self._warned = True
                    message = f"{self.name} preemption check failed ({type(err).__name__}: {err}); still polling."
                    warnings.warn(message, stacklevel=1)
            self._stop.wait(self.interval_s)


class PollingSource(ProcessLocal):
    """A notice source that checks in a daemon thread: start/poll/acknowledge/stop over a :class:`PollingThread`.

    Subclasses define ``_check`` (and ``name``); HTTP sources pass ``base_url``, validated here.
    """

    name = "polling"
    PROCESS_LOCAL: ClassVar[dict[str, Callable[[], Any] | None]] = {"_thread": None}

    def __init__(self, poll_interval: float, base_url: str | None = None) -> None:
        self.base_url = validate_base_url(base_url) if base_url is not None else None
        self.poll_interval = validate_interval(poll_interval, "poll_interval")
        self._thread = PollingThread(self.name, self._check, self.poll_interval)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._thread = PollingThread(self.name, self._check, self.poll_interval)  # a copy polls on its own

    def _check(self) -> Notice | None:
        raise NotImplementedError

    def start(self) -> None:
        """Start polling in a daemon thread (no check, and no network call, before this)."""
        self._thread.start()

    def poll(self) -> Notice | None:
        """The notice seen so far, if any."""
        return self._thread.notice

    def acknowledge(self, notice: Notice) -> None:
        """Nothing to answer for this source."""

    def stop(self) -> None:
        """Stop polling; safe to call twice."""
        self._thread.stop()
