"""ProgressWatchdog: a phase without progress past its allowance is reported with every stack and ends the process;
progress and unwatched phases do not."""

from __future__ import annotations

import threading
import time

from lightning_scale.health import HANG_EXIT_CODE, ProgressWatchdog


def test_a_phase_without_progress_is_reported_with_its_stacks_and_exits_75(capfd):
    exits: list[int] = []
    done = threading.Event()
    advice = "it is hung. Exiting with 75. Tune it."
    watchdog = ProgressWatchdog(HANG_EXIT_CODE, advice, exit_fn=lambda code: (exits.append(code), done.set()))
    started = time.monotonic()
    watchdog.arm("training step 7 (epoch 0, batch 6)", 0.5)
    assert done.wait(10) and exits == [75]
    assert 0.5 <= time.monotonic() - started < 3
    err = capfd.readouterr().err
    assert (
        "made no progress for 0 s in training step 7 (epoch 0, batch 6)" in err or "for 1 s in training step 7" in err
    )
    assert "(worker pids []); it is hung. Exiting with 75. Tune it. Stacks follow." in err
    assert "test_a_phase_without_progress_is_reported" in err  # this process's stacks
    watchdog.close()


def test_progress_and_unwatched_phases_never_fire():
    exits: list[int] = []
    now = [0.0]  # the watchdog's clock, moved by the test: a loaded machine cannot make a mark late
    watchdog = ProgressWatchdog(HANG_EXIT_CODE, "", exit_fn=exits.append, clock=lambda: now[0])
    for step in range(6):  # each mark within the allowance
        watchdog.arm(f"training step {step}", 0.5)
        now[0] += 0.45
        time.sleep(0.05)  # the watchdog's thread looks meanwhile
    watchdog.arm("saving a checkpoint", None)
    now[0] += 100.0  # longer than any allowance: unwatched
    time.sleep(0.2)
    watchdog.close()
    watchdog.close()  # safe twice
    assert exits == []
