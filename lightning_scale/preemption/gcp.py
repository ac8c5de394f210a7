"""GCP preemptible and spot VM notices through the metadata server."""

from __future__ import annotations

import time

from lightning_scale.preemption.notice import Notice
from lightning_scale.preemption.polling import PollingSource, http_request, validate_interval

__all__ = ["GCPPreemptionNotice"]


class GCPPreemptionNotice(PollingSource):
    """GCP preemptible/spot VM notice: ``instance/preempted`` turns ``TRUE`` about 30 s before the stop.

    Args:
        base_url: Metadata server address.
        poll_interval: Seconds between checks.
        grace_seconds: Time from the notice to the stop.

    Examples:
        >>> GCPPreemptionNotice(base_url="http://127.0.0.1:8112").poll() is None
        True
    """

    name = "gcp"

    def __init__(
        self, base_url: str = "http://metadata.google.internal", poll_interval: float = 5.0, grace_seconds: float = 30.0
    ) -> None:
        super().__init__(poll_interval, base_url)
        self.grace_seconds = validate_interval(grace_seconds, "grace_seconds")

    def _check(self) -> Notice | None:
        url = f"{self.base_url}/computeMetadata/v1/instance/preempted"
        status, body = http_request(url, headers={"Metadata-Flavor": "Google"})
        if status != 200:
            raise OSError(f"{url} answered HTTP {status}")
        answer = body.decode().strip().upper()
        if answer not in ("TRUE", "FALSE"):
            raise ValueError(f"{url} answered {answer[:40]!r}, expected TRUE or FALSE")
        if answer == "FALSE":
            return None
        now = time.time()
        return Notice("gcp", now, now + self.grace_seconds, "instance/preempted=TRUE")
