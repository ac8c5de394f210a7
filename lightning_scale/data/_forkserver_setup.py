"""Imported once by the forkserver that starts DataLoader workers (see ``forkserver.FORKSERVER_PRELOAD``).

Every worker forked from it inherits a SIGUSR2 handler that dumps its threads' stacks, which is how
``WorkerStartWatchdog`` shows where a worker that never delivered a batch is stuck.
"""

import faulthandler
import signal

faulthandler.register(signal.SIGUSR2, all_threads=True)
