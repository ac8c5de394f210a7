"""DataLoader workers that start safely in distributed runs: from a forkserver, where that cannot change what they do.

A rank that forks its DataLoader workers while gloo's or NCCL's threads (and other loaders' queue feeders) run can,
rarely, leave a worker deadlocked inside ``os.fork()``: the job then hangs before its first batch. Workers started
from a forkserver are forked by a process that runs no such threads. They differ from forked ones in two ways, which
:func:`safe_worker_context` checks before it chooses them: they receive the dataset, ``collate_fn`` and
``worker_init_fn`` pickled (arrays are copied or moved to shared memory, not shared copy-on-write), and they import
the script being run, as ``spawn`` workers do.

Under warm restarts (:mod:`lightning_scale.restart`) each rank's parent starts the forkserver once
(:func:`start_forkserver`), before it forks the first training attempt: every attempt uses that server, whose torch
is already imported, so a restarted attempt's workers start in milliseconds instead of the seconds a new server takes
to import torch; the parent kills a failed attempt's workers (:func:`kill_forkserver_workers`), whose own parent, the
server, lives on. Without warm restarts, ``lightning-scale fit`` forks the server the same way in each rank of several,
before it builds anything (:func:`start_forkserver_early`).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from lightning_scale._linux import parent_ids
from lightning_scale._python_internals import fork_forkserver, forkserver_pid, start_resource_tracker_apart
from lightning_scale.data._forkserver_setup import hand_main_to_server, prepare_server
from lightning_scale.distributed import has_process_group

__all__ = [
    "FORKSERVER_MAX_ARRAY_BYTES",
    "FORKSERVER_PRELOAD",
    "kill_forkserver_workers",
    "safe_worker_context",
    "start_forkserver",
    "start_forkserver_early",
    "start_workers_safely",
    "worker_context",
]

FORKSERVER_PRELOAD = ["lightning_scale.data.worker_rng_dataset", "torch", "lightning_scale.data._forkserver_setup"]
"""Modules the forkserver imports once, so that each worker forked from it starts without importing them; the package
first, which imports torch and Lightning with the garbage collector paused (:mod:`lightning_scale._collector`)."""

FORKSERVER_MAX_ARRAY_BYTES = 64 * 1024 * 1024
"""Above this many bytes of tensors and arrays in the dataset (and ``collate_fn``, ``worker_init_fn``), workers keep
fork: pickled for a forkserver worker, tensors move to ``/dev/shm`` (64 MiB in a default Docker container) and NumPy
arrays are copied into every worker at every epoch's start; forked workers share them copy-on-write."""


def safe_worker_context(loader: Any, name: str) -> multiprocessing.context.BaseContext | None:
    """A forkserver context for ``loader``'s workers, or ``None`` (fork, with a warning saying why) where a forkserver
    would change what the workers do or cost: what does not pickle, large arrays, CUDA tensors, a NumPy memmap, a
    class or function of the running script that workers cannot import, or a script that runs code at import."""
    problem = _why_not_forkserver((loader.dataset, loader.collate_fn, loader.worker_init_fn))
    if problem is not None:
        warnings.warn(
            f"{name}: its workers start with fork, which can rarely deadlock a worker at start-up while the process "
            f"group's threads run, because {problem}. Fix that, or choose multiprocessing_context yourself to "
            "silence this.",
            stacklevel=2,
        )
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)  # takes effect when the forkserver starts (once per process)
    hand_main_to_server()  # which the server imports once, not every worker at its start (what the check above allows)
    start_resource_tracker_apart()  # the workers' semaphores are unlinked even if torchrun kills the rank's group
    return context


def worker_context(loader: Any, name: str, world_size: int) -> multiprocessing.context.BaseContext | None:
    """The context ``loader``'s workers start with in a run of ``world_size`` processes: the one it chose; with
    workers in a distributed run and none chosen, a forkserver (:func:`safe_worker_context`); else ``None`` (fork).

    Args:
        loader: A ``DataLoader`` (or a subclass).
        name: How to call the loader in the warning of :func:`safe_worker_context`.
        world_size: Processes in the run.
    """
    context = loader.multiprocessing_context
    if context is None and loader.num_workers > 0 and world_size > 1:
        return safe_worker_context(loader, name)
    return context


def start_workers_safely(loader: Any, name: str, world_size: int) -> None:
    """Give ``loader`` the context of :func:`worker_context` where it chose none; other objects than DataLoaders are
    left alone. For loaders that are used as they are (validation, test, prediction); a training loader is rebuilt
    with that context (:func:`~lightning_scale.data.resumable_loader.make_resumable`)."""
    if hasattr(loader, "multiprocessing_context") and loader.multiprocessing_context is None:
        loader.multiprocessing_context = worker_context(loader, name, world_size)


def start_forkserver() -> int:
    """Start multiprocessing's forkserver with :data:`FORKSERVER_PRELOAD` now; its process id. Processes forked from
    this one afterwards use it once they adopt it (:func:`lightning_scale._python_internals.adopt_forkserver`).

    From a process that runs no other Python thread and no process group, the server is a fork of it, with
    everything it imported: it serves at once and shares this process's memory, where a new interpreter would spend
    seconds of CPU and hundreds of MB importing torch and Lightning again. Otherwise (or where this Python's
    forkserver differs) it is started as usual, without waiting for its imports."""
    pid = _fork_forkserver()
    if pid is not None:
        return pid
    multiprocessing.forkserver.ensure_running()
    pid = forkserver_pid()
    assert pid is not None, "ensure_running started no forkserver"
    return pid


def start_forkserver_early() -> int | None:
    """In a process that a launcher started as one rank of several (``WORLD_SIZE``, or an ``srun`` step's
    ``SLURM_STEP_NUM_TASKS``, over 1), before it builds anything: the forkserver its DataLoader workers will start
    from, forked from it now as :func:`start_forkserver` does; its process id. Later, with the process group's threads
    running, the server could only be a new interpreter, which imports torch and Lightning for seconds of CPU while
    the rank waits for its first batch. ``None``, and nothing started, where a fork cannot be made now (another thread
    runs, a process group exists, a server runs already) or the process is alone; its loaders start a server as
    usual if they need one. An unused server idles, sharing this process's memory, and dies with it."""
    launched = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_STEP_NUM_TASKS") or "1"
    return _fork_forkserver() if int(launched) > 1 else None


def _fork_forkserver() -> int | None:
    """The forkserver as a fork of this process, where it runs no other thread and no process group: its id."""
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    start_resource_tracker_apart()  # which the server and its workers use too
    if threading.active_count() > 1 or has_process_group():
        return None
    for module in FORKSERVER_PRELOAD[:-1]:
        importlib.import_module(module)
    rank = os.getpid()
    return fork_forkserver(lambda: prepare_server(rank))


def kill_forkserver_workers(server: int) -> list[int]:
    """Kill (SIGKILL) every process the forkserver ``server`` forked, the DataLoader workers of an attempt that ended;
    the ids killed. A forkserver worker watches its parent, the server, which lives on: it would not end by itself."""
    killed = [pid for pid, parent in parent_ids().items() if parent == server]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed


class _TrialPickler(pickle.Pickler):
    """Pickles the structure of objects without their array data: what arrays they hold, and what of ``__main__``."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.array_bytes = 0
        self.special: str | None = None
        self.from_main: set[str] = set()

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu":
                self.special = f"they hold a {obj.device.type} tensor (each worker would initialise the device)"
            self.array_bytes += obj.untyped_storage().nbytes()
            return id(obj)
        if isinstance(obj, torch.UntypedStorage):
            self.array_bytes += obj.nbytes()
            return id(obj)
        if type(obj).__module__ == "numpy" and hasattr(obj, "nbytes"):
            if type(obj).__name__ == "memmap":
                self.special = "they hold a NumPy memmap (each worker would read the whole file)"
            self.array_bytes += int(obj.nbytes)
            return id(obj)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if getattr(obj, "__module__", None) == "__main__" and isinstance(getattr(obj, "__qualname__", None), str):
            self.from_main.add(obj.__qualname__.split(".")[0])
        return NotImplemented


def _why_not_forkserver(objects: tuple[Any, ...]) -> str | None:
    pickler = _TrialPickler()
    try:
        pickler.dump(objects)
    except Exception as error:  # what pickling raises is open-ended (PicklingError, TypeError, AttributeError)
        return f"the dataset, collate_fn or worker_init_fn cannot be pickled ({type(error).__name__}: {error})"
    if pickler.special is not None:
        return pickler.special
    if pickler.array_bytes > FORKSERVER_MAX_ARRAY_BYTES:
        return (
            f"they hold {pickler.array_bytes / 2**20:.0f} MiB of tensors and arrays (over "
            f"{FORKSERVER_MAX_ARRAY_BYTES / 2**20:.0f} MiB: forked workers share them, forkserver workers would get "
            "them through shared memory or a copy)"
        )
    return _main_problem(pickler.from_main)


def _main_problem(from_main: set[str]) -> str | None:
    """Why workers that import the running script (as spawn and forkserver workers do) would behave otherwise than
    forked ones, or ``None``."""
    main = sys.modules.get("__main__")
    module_name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    names = ", ".join(sorted(from_main))
    if (module_name is not None and module_name.split(".")[-1] == "__main__") or path is None:
        # a package's __main__ is never imported by workers, and a session without a script has nothing to import
        return (
            f"{names} is defined in {module_name or 'an interactive session'}, which workers cannot import"
            if (from_main)
            else None
        )
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return f"the script being run ({path}) cannot be read to check what importing it does"
    for node in tree.body:
        if not _definition_only(node):
            return (
                f"the script being run ({Path(path).name}) runs code at import (line {node.lineno}), which every "
                'forkserver worker would run again: keep it under `if __name__ == "__main__":`'
            )
    missing = from_main - _top_level_names(tree)
    if missing:
        return (
            f'{", ".join(sorted(missing))} is defined inside `if __name__ == "__main__":` of {Path(path).name}, '
            "where workers importing the script do not find it: define it at the top level"
        )
    return None


def _definition_only(node: ast.stmt) -> bool:
    """Whether running ``node`` at import only defines things: imports, functions, classes, constants, ``sys.path``
    changes, the ``__main__`` guard, and ``if``/``try`` blocks of those."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass)):
        return True
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant) or _is_sys_path_change(node.value)
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value is None or _is_constant(node.value)
    if isinstance(node, ast.If):
        if _is_main_guard(node.test):
            return all(_definition_only(child) for child in node.orelse)
        return all(_definition_only(child) for child in [*node.body, *node.orelse])
    if isinstance(node, ast.Try):
        children = [*node.body, *node.orelse, *node.finalbody, *(c for h in node.handlers for c in h.body)]
        return all(_definition_only(child) for child in children)
    return False


def _is_constant(value: ast.expr) -> bool:
    if isinstance(value, (ast.Constant, ast.Name)):
        return True
    if isinstance(value, ast.Attribute):
        return _is_constant(value.value)
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_constant(item) for item in value.elts)
    if isinstance(value, ast.Dict):
        return all(item is None or _is_constant(item) for item in [*value.keys, *value.values])
    if isinstance(value, ast.BinOp):
        return _is_constant(value.left) and _is_constant(value.right)
    if isinstance(value, ast.UnaryOp):
        return _is_constant(value.operand)
    return False


def _is_sys_path_change(value: ast.expr) -> bool:
    func = value.func if isinstance(value, ast.Call) else None
    return (
        isinstance(func, ast.Attribute) and func.attr in ("insert", "append") and ast.unparse(func.value) == "sys.path"
    )


def _is_main_guard(test: ast.expr) -> bool:
    return isinstance(test, ast.Compare) and {ast.unparse(test.left), *map(ast.unparse, test.comparators)} == {
        "__name__",
        "'__main__'",
    }


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
