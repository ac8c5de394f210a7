"""Imported once by the forkserver that starts DataLoader workers, after the other modules it preloads (see
``forkserver.FORKSERVER_PRELOAD``).

Every worker forked from it inherits a SIGUSR2 handler that dumps its threads' stacks, which is how
``WorkerStartWatchdog`` shows where a worker that never delivered a batch is stuck. In the forkserver only (tools such
as pytest's doctest collection import every module), the preloaded objects are then frozen out of the cyclic garbage
collector (``gc.freeze``, made for processes that fork): workers do not touch their pages when the collector runs,
and the server's own exit skips collecting them (about 1 s of CPU per rank).
"""

import faulthandler
import gc
import signal
import traceback

faulthandler.register(signal.SIGUSR2, all_threads=True)
if any(frame.filename.endswith("multiprocessing/forkserver.py") for frame in traceback.extract_stack()):
    gc.freeze()
