"""EC2 spot interruption notices through the instance metadata service (IMDSv2)."""

from __future__ import annotations

import datetime
import json
import time

from lightning_scale.preemption.notice import Notice
from lightning_scale.preemption.polling import PollingSource, http_request

__all__ = ["AWSSpotNotice"]


class AWSSpotNotice(PollingSource):
    """EC2 spot interruption notice (about 2 minutes ahead), through the IMDSv2 token flow.

    ``PUT /latest/api/token`` gives a session token; ``GET /latest/meta-data/spot/instance-action`` answers 404 until
    an interruption is scheduled, then ``{"action": "terminate", "time": "2026-12-02T15:00:00Z"}``.

    Args:
        base_url: Instance metadata address.
        poll_interval: Seconds between checks.

    Examples:
        >>> AWSSpotNotice(base_url="http://127.0.0.1:8111", poll_interval=0.2).poll() is None
        True
    """

    name = "aws"
    TOKEN_TTL_S = 21600

    def __init__(self, base_url: str = "http://169.254.169.254", poll_interval: float = 5.0) -> None:
        super().__init__(poll_interval, base_url)
        self._token: tuple[str, float] | None = None

    def _token_header(self) -> dict[str, str]:
        if self._token is None or time.monotonic() > self._token[1]:
            status, body = http_request(
                f"{self.base_url}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)},
            )
            if status != 200:
                raise OSError(f"IMDSv2 token request answered HTTP {status}")
            self._token = (body.decode().strip(), time.monotonic() + self.TOKEN_TTL_S / 2)
        return {"X-aws-ec2-metadata-token": self._token[0]}

    def _check(self) -> Notice | None:
        url = f"{self.base_url}/latest/meta-data/spot/instance-action"
        status, body = http_request(url, headers=self._token_header())
        if status == 401:  # token expired or revoked: fetch a new one next time
            self._token = None
            raise OSError("IMDSv2 token was refused (HTTP 401)")
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"{url} answered HTTP {status}")
        action = json.loads(body)
        deadline = datetime.datetime.fromisoformat(action["time"].replace("Z", "+00:00")).timestamp()
        return Notice("aws", time.time(), deadline, f"action={action.get('action')} time={action['time']}")
