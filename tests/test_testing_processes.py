"""``lightning_scale.testing.processes``: a simulated lost machine takes its processes' shared memory with them."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from lightning_scale.testing.processes import kill_processes


def test_a_killed_process_takes_its_torch_shared_memory_segments_and_no_other_process_s():
    victim, bystander = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        segments = {pid: Path(f"/dev/shm/torch_{pid}_123_0") for pid in (victim.pid, bystander.pid)}
        for segment in segments.values():
            segment.write_bytes(b"tensor")
        assert kill_processes([victim.pid]) == [victim.pid]
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert not segments[victim.pid].exists() and segments[bystander.pid].exists()
    finally:
        bystander.kill()
        bystander.wait()
        segments[bystander.pid].unlink(missing_ok=True)
