"""The one place where lightning-scale touches a private part of CPython (the twin of ``_torch_internals.py``).

1. ``run_exit_functions``: ``atexit._run_exitfuncs``, the exit functions an interpreter runs as it ends. A warm-restart
   child (:mod:`lightning_scale.restart.supervisor`) leaves with ``os._exit``, without tearing the interpreter down
   (the objects it inherited from its parent, such as a store server whose thread lives only in the parent, must not
   be finalised), but what the training registered to run at exit (W&B finishing its run files) still has to run.

``tests/test_python_internals.py`` fails loudly when a Python upgrade moves it.
"""

from __future__ import annotations

import atexit

__all__ = ["run_exit_functions"]


def run_exit_functions() -> None:
    """Run (and clear) the functions registered with ``atexit``, as interpreter shutdown would."""
    atexit._run_exitfuncs()
