"""The one place where lightning-scale touches a private part of CPython (the twin of ``_torch_internals.py``).

1. ``run_exit_functions``: ``atexit._run_exitfuncs``, the exit functions an interpreter runs as it ends. A warm-restart
   child (:mod:`lightning_scale.restart.supervisor`) leaves with ``os._exit``, without tearing the interpreter down
   (the objects it inherited from its parent, such as a store server whose thread lives only in the parent, must not
   be finalised), but what the training registered to run at exit (W&B finishing its run files) still has to run.

2. ``forkserver_pid`` and ``adopt_forkserver``: ``multiprocessing.forkserver._forkserver``, the module's one
   ``ForkServer``, and its ``_lock``, ``_forkserver_pid``, ``_forkserver_address`` and ``_forkserver_alive_fd``. A
   warm-restart child uses the forkserver its parent started
   (:func:`lightning_scale.data.forkserver.start_forkserver`), which it inherits as these fields; but
   ``ForkServer.ensure_running`` asks ``os.waitpid`` whether the server lives, which only the server's parent may (the
   child, its sibling, gets ``ChildProcessError``). The adopted server's ``ensure_running`` looks at ``/proc``
   instead, and forgets a server that is gone, so that a new one is started.

3. ``start_resource_tracker_apart``: ``multiprocessing.resource_tracker._resource_tracker._fd`` (whether this process
   has a tracker) and ``multiprocessing.util.spawnv_passfds``, through which ``ResourceTracker.ensure_running`` starts
   the tracker as ``python -c 'from multiprocessing.resource_tracker import main;main(fd)'``. The tracker unlinks the
   named semaphores (``/dev/shm/sem.mp-*``) that forkserver DataLoader workers' queues leave when their process dies;
   started as usual it shares the rank's process group, and torchrun ends a rank by killing that whole group
   (``os.killpg``, SIGKILL 30 s after SIGTERM for a stopped rank), the tracker with it, so they stayed in ``/dev/shm``.
   Started apart, in a process group of its own, it outlives the kill, sees the rank's end and unlinks them.

4. ``start_method_of``: ``BaseProcess._start_method``, how a ``multiprocessing`` process was started (the class of
   the context that made it: ``fork``, ``forkserver``, ``spawn``), ``None`` for a process of the default context.

5. ``fork_forkserver``: ``ForkServer.ensure_running``'s start of the server, done with ``os.fork`` instead of a new
   interpreter: the same listening socket (``multiprocessing.connection.arbitrary_address``) and "alive" pipe, the
   ``_forkserver_address``, ``_forkserver_alive_fd`` and ``_forkserver_pid`` it sets, and
   ``multiprocessing.forkserver.main`` called in the forked process with nothing left to preload. Where ``main``'s
   parameters differ from the ones this mirrors (Python 3.14 added an authentication key) it starts nothing, and the
   server is started as usual.

``tests/test_python_internals.py`` fails loudly when a Python upgrade moves them.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.process
import multiprocessing.util
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import resource_tracker
from typing import Any, NoReturn

from lightning_scale._linux import process_state

__all__ = [
    "adopt_forkserver",
    "fork_forkserver",
    "forkserver_pid",
    "run_exit_functions",
    "start_method_of",
    "start_resource_tracker_apart",
]


def run_exit_functions() -> None:
    """Run (and clear) the functions registered with ``atexit``, as interpreter shutdown would."""
    atexit._run_exitfuncs()


def forkserver_pid() -> int | None:
    """The process id of the forkserver this process started or inherited, ``None`` before one was started."""
    server: Any = multiprocessing.forkserver._forkserver
    return None if server._forkserver_pid is None else int(server._forkserver_pid)


def adopt_forkserver() -> None:
    """In a process forked from the one that started multiprocessing's forkserver: use that server for this process's
    forkserver workers (a no-op where none was started)."""
    server: Any = multiprocessing.forkserver._forkserver
    pid = server._forkserver_pid
    if pid is None:
        return
    launch = server.ensure_running

    def ensure_running() -> None:
        with server._lock:
            if server._forkserver_pid == pid:
                if _alive(pid):
                    resource_tracker.ensure_running()
                    return
                os.close(server._forkserver_alive_fd)
                server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
        launch()

    server.ensure_running = ensure_running


_FORKSERVER_MAIN = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")


def fork_forkserver(prepare: Callable[[], None]) -> int | None:
    """Start multiprocessing's forkserver as a fork of this process, which has already imported what the workers need,
    instead of an interpreter that imports it all again; its process id. ``prepare`` runs in the server before it
    serves. ``None`` where a server runs already, or where this Python's forkserver is not the one this mirrors (start
    it as usual then). Call it from a process that runs no other thread."""
    server: Any = multiprocessing.forkserver._forkserver
    if tuple(inspect.signature(multiprocessing.forkserver.main).parameters) != _FORKSERVER_MAIN:
        return None
    with server._lock:
        if server._forkserver_pid is not None:
            return None
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = multiprocessing.connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
            listener.bind(address)
            if not multiprocessing.util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # every client holds the write end; the server ends once all are gone
            sys.stdout.flush()  # or the server's workers would print what is buffered here again as they exit
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(alive_w)
                _serve(listener.fileno(), alive_r, prepare)
            os.close(alive_r)
        server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    return pid


def _serve(listener_fd: int, alive_r: int, prepare: Callable[[], None]) -> NoReturn:
    """The forked server: as a new one would be, with no forkserver of its own and the default signal handlers."""
    server: Any = multiprocessing.forkserver._forkserver
    server._lock = threading.Lock()  # held by the parent as it forked
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    code = 1
    try:
        for sig in signal.valid_signals():
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, signal.SIG_DFL)
        prepare()
        multiprocessing.forkserver.main(listener_fd, alive_r, [])
    except SystemExit as ended:  # how main ends once every client is gone
        code = ended.code if isinstance(ended.code, int) else 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    return process_state(pid) not in ("Z", "X", None)


def start_resource_tracker_apart() -> None:
    """Start this process's multiprocessing resource tracker in a process group of its own, unless it has one already
    (see the module's description); it ends, as always, once every process that uses it is gone."""
    tracker: Any = resource_tracker._resource_tracker
    if tracker._fd is not None:
        return
    spawn: Any = multiprocessing.util.spawnv_passfds

    def spawn_apart(path: bytes, args: Sequence[Any], passfds: Sequence[int]) -> int:
        code = list(args).index("-c") + 1
        apart = [*args[:code], f"import os; os.setpgid(0, 0); {args[code]}", *args[code + 1 :]]
        pid = spawn(path, apart, passfds)
        deadline = time.monotonic() + 5  # apart once its interpreter has started (tens of ms)
        with contextlib.suppress(ProcessLookupError):
            while os.getpgid(pid) == os.getpgrp() and time.monotonic() < deadline:
                time.sleep(0.002)
        return int(pid)

    multiprocessing.util.spawnv_passfds = spawn_apart
    try:
        resource_tracker.ensure_running()
    finally:
        multiprocessing.util.spawnv_passfds = spawn


def start_method_of(process: multiprocessing.process.BaseProcess) -> str:
    """How ``process`` was started: its context's start method, or the default one's."""
    return getattr(process, "_start_method", None) or multiprocessing.get_start_method()
