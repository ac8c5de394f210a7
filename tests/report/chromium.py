"""A real headless browser for the report's tests: Debian's Chromium, installed with apt-get when missing (as root).

Where it cannot run, the tests that need it are skipped with the reason; with ``CI=true`` that is a failure instead.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.debian import apt_get_install, command

PACKAGES = ("chromium",)


def chromium() -> str:
    """The path of a headless-capable Chromium, installing Debian's package when missing; skips (fails under
    ``CI=true``) where there is none and none can be installed."""
    found = command("chromium") or command("chromium-browser")
    if found is None and os.geteuid() == 0 and command("apt-get") is not None:
        problem = apt_get_install(PACKAGES)
        found = command("chromium")
        if found is None:
            _skip_or_fail(f"`apt-get install chromium` did not install it: {problem}")
    if found is None:
        _skip_or_fail("no chromium, and no root and apt-get to install Debian's package")
    return str(found)


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, and the browser test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Rendered:
    """What the browser made of a page: its DOM after loading, its console's errors, and a screenshot."""

    dom: str
    errors: list[str]
    screenshot: Path


def render(page: Path, screenshot: Path, timeout_s: float = 120.0) -> Rendered:
    """Open ``page`` (a local file, with no network: every request elsewhere fails) and take a screenshot."""
    browser = chromium()
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        common = [
            browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
            "--proxy-server=127.0.0.1:9", "--disable-background-networking", "--disable-component-update",
            "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
        ]  # fmt: skip
        shot = subprocess.run(
            [*common, "--window-size=900,2600", f"--screenshot={screenshot}", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        dom = subprocess.run(
            [*common, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=timeout_s
        )
    assert shot.returncode == 0 and dom.returncode == 0, shot.stderr[-2000:] + dom.stderr[-2000:]
    log = shot.stderr + dom.stderr
    errors = [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line or "net::ERR" in line]
    return Rendered(dom.stdout, errors, screenshot)
