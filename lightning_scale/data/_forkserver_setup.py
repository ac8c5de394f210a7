"""Imported once by the forkserver that starts DataLoader workers, after the other modules it preloads (see
``forkserver.FORKSERVER_PRELOAD``); a forkserver forked from a warm-restart parent calls :func:`prepare_server`
instead (``forkserver.start_forkserver``).

In the forkserver only (tools such as pytest's doctest collection import every module):

- every worker forked from it inherits a SIGUSR2 handler that dumps its threads' stacks, which is how
  ``WorkerStartWatchdog`` shows where a worker that never delivered a batch is stuck;
- the preloaded objects are frozen out of the cyclic garbage collector (``gc.freeze``, made for processes that fork):
  workers do not touch their pages when the collector runs, and the server's own exit skips collecting them (about
  1 s of CPU per rank);
- the forkserver dies with the rank that started it. A rank killed with SIGKILL (the OOM killer, a lost process)
  otherwise leaves its forkserver running, and the workers forked from it too: a DataLoader worker watches for its
  parent's death, and a forkserver worker's parent is the forkserver. Once the forkserver is gone, its workers see it
  and exit;
- each worker dies with the forkserver, and exits at its start if the server is already gone. A worker watches the
  parent it found at its start: one forked just before a killed rank took the server with it found init there, and
  waited forever, holding the resource tracker (and the job's semaphores) with it;
- the script being run is imported once, here, as workers import it (``__mp_main__``), where the rank that starts
  the server named it (:data:`MAIN_VARIABLE`, :func:`hand_main_to_server`). multiprocessing's forkserver never does
  (Python 3.11's asks for a ``main_path`` its preparation data does not hold), so every worker ran the script's top
  level, and imported whatever it imports that the server had not, at every start: with non-persistent workers, at
  every epoch (0.35 s more per epoch here for a script that imports ``wandb``).
"""

import faulthandler
import gc
import json
import multiprocessing.spawn
import multiprocessing.util
import os
import signal
import sys
import traceback

from lightning_scale._linux import die_with_parent

__all__ = ["MAIN_VARIABLE", "hand_main_to_server", "prepare_server"]

MAIN_VARIABLE = "LIGHTNING_SCALE_FORKSERVER_MAIN"
"""In the environment of a process that may start a forkserver: its process id and what of its preparation data
names its script and where workers import it (``sys.path``, ``sys.argv``, the directory; JSON). A forkserver started
by another process ignores it."""

MAX_NAMED_BYTES = 32 * 1024
"""The longest :data:`MAIN_VARIABLE` set: a variable of more than 128 KiB would make every later ``exec`` of the
process fail (Linux's limit on one string of the environment)."""

_server: int | None = None  # in the forkserver and, until they start, its workers: the server's process id


def prepare_server(rank: int) -> None:
    """In the forkserver: the workers' SIGUSR2 handler; freeze what it holds out of the collector; die with process
    ``rank``, which started it; have each worker die with the server."""
    global _server
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    gc.freeze()
    die_with_parent(rank)
    _server = os.getpid()
    multiprocessing.util.register_after_fork(sys.modules[__name__], _die_with_the_server)


def hand_main_to_server() -> None:
    """In a rank, before its forkserver starts: name the script being run to the server (:data:`MAIN_VARIABLE`)."""
    data = multiprocessing.spawn.get_preparation_data("forkserver")
    wanted = ("init_main_from_name", "init_main_from_path", "sys_path", "sys_argv", "dir", "orig_dir")  # as a worker
    named = json.dumps({"pid": os.getpid(), **{key: data[key] for key in wanted if key in data}})
    if len(named) <= MAX_NAMED_BYTES:  # else workers import the script themselves, as before
        os.environ[MAIN_VARIABLE] = named


def _import_main(parent: int) -> None:
    """In the forkserver: import the script ``parent`` named, as each worker's own preparation would (a script that
    fails to import here is left to the workers, which report it as before)."""
    named = json.loads(os.environ.get(MAIN_VARIABLE, "{}"))
    if named.pop("pid", None) != parent:
        return
    try:
        multiprocessing.spawn.prepare(named)
    except Exception:  # whatever the script raises at import: each worker's own import raises it again, and reports it
        return


def _die_with_the_server(_: object) -> None:
    """In a worker as it starts (multiprocessing's after-fork hooks): die with the forkserver, or exit now if it is
    gone; processes the worker starts in turn are left alone."""
    global _server
    if _server is not None:
        server, _server = _server, None
        die_with_parent(server)


if any(frame.filename.endswith("multiprocessing/forkserver.py") for frame in traceback.extract_stack()):
    prepare_server(os.getppid())
    _import_main(os.getppid())
