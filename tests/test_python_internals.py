"""The private part of CPython that ``_python_internals.py`` wraps, checked so that a Python upgrade fails here."""

from __future__ import annotations

import subprocess
import sys


def test_run_exit_functions_runs_what_atexit_registered_in_a_process_that_leaves_with_os_exit():
    script = (
        "import atexit, os\n"
        "from lightning_scale._python_internals import run_exit_functions\n"
        "atexit.register(print, 'exit function ran')\n"
        "run_exit_functions()\n"
        "os._exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout == "exit function ran\n"
