"""Azure spot eviction notices through Scheduled Events."""

from __future__ import annotations

import email.utils
import json
import time

from lightning_scale.preemption.notice import Notice
from lightning_scale.preemption.polling import PollingSource, http_request, validate_interval

__all__ = ["AzureScheduledEvents"]


class AzureScheduledEvents(PollingSource):
    """Azure spot eviction: a ``Preempt`` event in Scheduled Events, acknowledged once the checkpoint is durable.

    Args:
        base_url: Instance metadata address.
        poll_interval: Seconds between checks.
        grace_seconds: Time from the notice to the eviction when the event has no ``NotBefore``.

    Examples:
        >>> AzureScheduledEvents(base_url="http://127.0.0.1:8113").poll() is None
        True
    """

    name = "azure"
    PATH = "/metadata/scheduledevents?api-version=2020-07-01"

    def __init__(
        self, base_url: str = "http://169.254.169.254", poll_interval: float = 5.0, grace_seconds: float = 30.0
    ) -> None:
        super().__init__(poll_interval, base_url)
        self.grace_seconds = validate_interval(grace_seconds, "grace_seconds")

    def _check(self) -> Notice | None:
        status, body = http_request(f"{self.base_url}{self.PATH}", headers={"Metadata": "true"})
        if status != 200:
            raise OSError(f"Scheduled Events answered HTTP {status}")
        document = json.loads(body)
        events = document.get("Events") if isinstance(document, dict) else None
        if not isinstance(events, list):
            raise ValueError(f"Scheduled Events answered {body[:60]!r}, expected a JSON object with an 'Events' list")
        for event in events:
            if event.get("EventType") == "Preempt":
                now = time.time()
                not_before = event.get("NotBefore")
                deadline = email.utils.parsedate_to_datetime(not_before).timestamp() if not_before else now
                deadline = deadline if deadline > now else now + self.grace_seconds
                return Notice("azure", now, deadline, f"EventId={event['EventId']}")
        return None

    def acknowledge(self, notice: Notice) -> None:
        """Approve the event (``StartRequests``), so that Azure need not wait for ``NotBefore``."""
        event_id = notice.detail.removeprefix("EventId=")
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        http_request(f"{self.base_url}{self.PATH}", method="POST", headers={"Metadata": "true"}, body=body)
