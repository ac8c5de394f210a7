"""`make demo`: a 2-process CPU DDP run is killed mid-epoch, re-run with the same command, and resumes by itself.

The job is ``examples/train.py`` under ``torchrun``. Once its checkpoint at step ``--kill-after`` is durable, the demo
kills the whole job with SIGKILL (as a lost machine would), then starts the very same command again: the
``ResumableCheckpoint`` finds the newest valid checkpoint, every rank gets back its own data position and RNG state,
and training continues where it stopped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.testing.processes import kill_process_tree

ROOT = Path(__file__).resolve().parents[1]


def newest_step(ckpt_dir: Path) -> int:
    manifest, _ = find_newest_valid(CheckpointStore(str(ckpt_dir)))
    return -1 if manifest is None else manifest.global_step


def run(command: list[str], kill_after: int | None, ckpt_dir: Path, timeout_s: float) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        if kill_after is not None and newest_step(ckpt_dir) >= kill_after:
            kill_process_tree(process.pid)
            process.wait()
            print(f"\n>>> Killed the whole job with SIGKILL after its checkpoint at step {newest_step(ckpt_dir)}.\n")
            return process.returncode
        if time.monotonic() > deadline:
            kill_process_tree(process.pid)
            raise SystemExit(f"the job did not finish within {timeout_s:.0f} s")
        time.sleep(0.1)
    return process.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "demo"), help="fresh directory for the run")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of the job")
    parser.add_argument("--kill-after", type=int, default=125, help="kill once this step's checkpoint is durable")
    args = parser.parse_args()

    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)

    def command(name: str) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "examples/train.py",
            "--ckpt-dir", str(workdir / name / "checkpoints"), "--steps", str(args.steps),
            "--save-weights", str(workdir / name / "final.pt"),
        ]  # fmt: skip

    started = time.monotonic()
    print(">>> Attempt 1:", " ".join(command("job")[1:]), flush=True)
    run(command("job"), args.kill_after, workdir / "job" / "checkpoints", timeout_s=300)
    print(">>> Attempt 2: the same command again", flush=True)
    if run(command("job"), None, workdir / "job" / "checkpoints", timeout_s=300) != 0:
        raise SystemExit("the resumed job failed")
    elapsed = time.monotonic() - started
    print(">>> For comparison, the same job without interruption", flush=True)
    if run(command("uninterrupted"), None, workdir / "uninterrupted" / "checkpoints", timeout_s=300) != 0:
        raise SystemExit("the uninterrupted job failed")
    resumed = torch.load(workdir / "job" / "final.pt", weights_only=True)
    reference = torch.load(workdir / "uninterrupted" / "final.pt", weights_only=True)
    identical = all(torch.equal(resumed[name], tensor) for name, tensor in reference.items())
    print(f">>> Killed and resumed job: {args.steps} steps in {elapsed:.0f} s over 2 attempts. Final weights "
          f"{'bitwise IDENTICAL to' if identical else 'DIFFERENT from'} the uninterrupted run.")  # fmt: skip
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
