"""The entry point of ``lightning-scale`` and ``python -m lightning_scale``."""

from __future__ import annotations

import os
import sys

from lightning_scale import distributed, knobs
from lightning_scale.cli.attempts import (
    end_a_later_attempt,
    remember_for_later_attempts,
    usage_error_of_an_earlier_attempt,
)
from lightning_scale.cli.command import ScaleCLI
from lightning_scale.cli.consolidate import consolidate
from lightning_scale.cli.strategy_flags import strategy_names_as_class_paths
from lightning_scale.cli.usage_errors import exit_on_usage_error, reported_on_this_node, usage_error_in
from lightning_scale.data.forkserver import start_forkserver_early
from lightning_scale.errors import USAGE_ERROR_EXIT_CODE
from lightning_scale.restart import supervise, warm_restarts_apply

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``lightning-scale`` and ``python -m lightning_scale``; once the command finished, it tears down
    the process group, whose gloo threads could otherwise abort the exiting process. Called with ``argv`` (from
    Python), it leaves the garbage collector as it was; as the command, it speeds up the process's exit (see
    :func:`lightning_scale.distributed.destroy_process_group`). As the command under torchrun, each rank's process
    runs the training as warm-restarted children (:mod:`lightning_scale.restart`; ``LIGHTNING_SCALE_WARM_RESTARTS``)
    and ends with their final exit code at once, without the interpreter's teardown; without them, a rank of several
    forks the forkserver of its loaders' workers first, as a warm-restart parent does
    (:func:`~lightning_scale.data.forkserver.start_forkserver_early`)."""
    explicit = argv is not None
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["consolidate"]:
        consolidate(argv[1:])
        return
    if argv[:1] == ["report"]:
        from lightning_scale.cli.report import report  # here: the report needs neither Lightning's CLI nor a job

        report(argv[1:])
        return
    if os.getcwd() not in sys.path:  # class paths in the current directory, as `python -m` finds them
        sys.path.insert(0, os.getcwd())
    if not explicit and warm_restarts_apply(knobs.WARM_RESTARTS):
        code = supervise(lambda: _run(argv, explicit), knobs.WARM_RESTARTS)
        # The parent trained nothing and has nothing to finish (its children ran their exit functions); the teardown of
        # an interpreter with torch and Lightning imported takes about a second here, which torchrun would wait for
        # before it restarts the job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if not explicit:  # a rank of several: its loaders' forkserver, a fork of it before it builds anything
        start_forkserver_early()
    _run(argv, explicit)


def _run(argv: list[str], explicit: bool) -> None:
    """The command itself: one training attempt."""
    rewritten = strategy_names_as_class_paths(argv)
    earlier = usage_error_of_an_earlier_attempt()
    if earlier is not None:  # torchrun restarts failed workers whatever their exit code: end this attempt at once
        end_a_later_attempt(earlier)
    try:
        if not explicit:  # the command line itself, which Lightning's launcher also gives the ranks it starts
            sys.argv[1:] = rewritten  # (LightningCLI warns when given args beside a command line)
        ScaleCLI(args=rewritten if explicit else None)  # not kept: garbage once finished
    except Exception as error:
        usage = usage_error_in(error)
        if usage is None:
            if reported_on_this_node():  # another rank's usage error, which this failure follows from
                raise SystemExit(USAGE_ERROR_EXIT_CODE) from None
            raise
        remember_for_later_attempts(str(usage))
        exit_on_usage_error(str(usage))
    finally:  # a gloo group alive at interpreter exit can abort the process (exit -6); the command's process ends
        distributed.destroy_process_group(process_ends=not explicit)
