"""Debian's packages for the tests that need a real program (Slurm's daemons, a headless Chromium): installed with
apt-get when missing, as root, once more after ``apt-get update`` when the package lists were stale."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

SYSTEM_PATH = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")  # daemons live in sbin, which a user's PATH may lack


def command(name: str) -> str | None:
    """The path of the program ``name`` (looked up in the system's directories too), or ``None``."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_PATH]))


def apt_get_install(packages: Sequence[str]) -> str:
    """Install ``packages``; apt-get's last output lines when it failed (nothing when it succeeded)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # another apt-get (a second test run installing too) holds dpkg's lock for a few seconds: wait for it
    install = ["apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=120", *packages]
    output = ""
    for update_first in (False, True):
        if update_first:
            run_quietly(["apt-get", "update"], env)
        installed, output = run_quietly(install, env)
        if installed:
            return ""
    return " / ".join(output.splitlines()[-3:])


def run_quietly(command: list[str], env: dict[str, str], timeout_s: float = 300.0) -> tuple[bool, str]:
    """Whether ``command`` succeeded, and its output."""
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"`{' '.join(command)}` took over {timeout_s:.0f} s"
    return done.returncode == 0, (done.stdout + done.stderr).strip()
