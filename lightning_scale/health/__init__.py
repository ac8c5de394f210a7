"""Keeping a job's processes honest: stack reports, a watchdog that turns a hang into a restart, the stopped peers a
hung rank has killed once it exited, and the judge of stragglers (no Lightning imports)."""

from lightning_scale.health.stacks import dump_stacks_on_sigusr2, report_stacks_and_stop_workers
from lightning_scale.health.stopped import kill_stopped_peers_after_exit, stopped_peers
from lightning_scale.health.stragglers import StragglerTally, WindowVerdict
from lightning_scale.health.watchdog import HANG_EXIT_CODE, ProgressWatchdog, StepAllowance

__all__ = [
    "HANG_EXIT_CODE",
    "ProgressWatchdog",
    "StepAllowance",
    "StragglerTally",
    "WindowVerdict",
    "dump_stacks_on_sigusr2",
    "kill_stopped_peers_after_exit",
    "report_stacks_and_stop_workers",
    "stopped_peers",
]
