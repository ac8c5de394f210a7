"""`make demo`: a 2-process CPU DDP job is preempted mid-run, restarted by torchrun, resumes exactly, and is priced.

The job is ``lightning-scale fit --config examples/configs/demo.yaml`` under ``torchrun --max-restarts 2``. Once its
checkpoint at step ``--preempt-after`` is durable, the demo sends SIGTERM to rank 1, as a spot reclaim does:
``SpotPreemption`` stops both ranks at the same step, ``ResumableCheckpoint`` saves it, the workers exit 143, torchrun
restarts them, and the restarted job prints its resume banner and carries on from that step. The same job run
without interruption must end with bitwise identical weights; the cost summary, the W&B run and the run report
(`lightning-scale report`: an HTML file of where the money and the time went) come last.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from lightning_scale.checkpoint import CheckpointStore, find_newest_valid
from lightning_scale.report import write_report
from lightning_scale.testing import launch_command, launch_environment
from lightning_scale.testing.processes import descendants, kill_process_tree

ROOT = Path(__file__).resolve().parents[1]


def newest_checkpoint(ckpt_dir: Path) -> tuple[int, str | None]:
    manifest, _ = find_newest_valid(CheckpointStore(str(ckpt_dir)))
    return (-1, None) if manifest is None else (manifest.global_step, str(ckpt_dir / manifest.name))


def rank_process(launcher: int, rank: int) -> int | None:
    """The pid of the worker of ``rank`` below the torchrun process ``launcher``."""
    for pid in descendants(launcher):
        try:
            if f"\0RANK={rank}\0" in "\0" + Path(f"/proc/{pid}/environ").read_text(errors="replace"):
                return pid
        except OSError:
            continue
    return None


def run(command: list[str], workdir: Path, preempt_after: int | None, timeout_s: float) -> str:
    """Run ``command``, echo its output as it comes, SIGTERM rank 1 once a checkpoint at ``preempt_after`` exists."""
    env = launch_environment([ROOT], PYTHONUNBUFFERED="1", WANDB_SILENT="true")
    if sys.stdout.isatty():
        env["TTY_INTERACTIVE"] = "1"  # the Rich progress bar, live, through the pipe
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    output, deadline = bytearray(), time.monotonic() + timeout_s
    while True:
        if select.select([process.stdout], [], [], 0.2)[0]:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            output += chunk
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        if preempt_after is not None and newest_checkpoint(workdir / "checkpoints")[0] >= preempt_after:
            pid = rank_process(process.pid, rank=1)
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
                print(
                    f"\n>>> Spot reclaim: SIGTERM to rank 1 (pid {pid}) after the checkpoint at step {preempt_after}.\n"
                )
                preempt_after = None
        if time.monotonic() > deadline:
            kill_process_tree(process.pid)
            raise SystemExit(f"the job did not finish within {timeout_s:.0f} s")
    if process.wait() != 0:
        raise SystemExit(f"the job failed with exit code {process.returncode}")
    return output.decode(errors="replace")


def final_weights(workdir: Path, steps: int) -> dict[str, torch.Tensor]:
    """The weights of the job in ``workdir`` after its last step, from its checkpoint of that step."""
    step, path = newest_checkpoint(workdir / "checkpoints")
    if step != steps or path is None:
        raise SystemExit(
            f"the newest checkpoint in {workdir} is of step {step}, not of the last step {steps}: choose --steps as a "
            "multiple of the config's checkpoint.every_n_train_steps"
        )
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "demo"), help="fresh directory for the runs")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of the job")
    parser.add_argument("--preempt-after", type=int, default=125, help="preempt once this step's checkpoint is durable")
    args = parser.parse_args()

    workdir = Path(args.workdir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)

    def command(name: str) -> list[str]:
        out = workdir / name
        fit = [
            "-m", "lightning_scale", "fit", "--config=examples/configs/demo.yaml", f"--trainer.max_steps={args.steps}",
            f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}",
            f"--checkpoint.dirpath={out / 'checkpoints'}",
        ]  # fmt: skip
        return launch_command(fit, 2, max_restarts=2)

    print(">>> The job:", " ".join(["torchrun", *command("job")[3:]]), flush=True)
    started = time.monotonic()
    output = run(command("job"), workdir / "job", args.preempt_after, timeout_s=300)
    elapsed = time.monotonic() - started
    print(">>> For comparison, the same job without interruption", flush=True)
    run(command("uninterrupted"), workdir / "uninterrupted", None, timeout_s=300)

    resumed = final_weights(workdir / "job", args.steps)
    reference = final_weights(workdir / "uninterrupted", args.steps)
    identical = resumed.keys() == reference.keys() and all(torch.equal(resumed[k], v) for k, v in reference.items())
    banner = re.search(r"Auto-resuming from .*\n(  .*\n)*", output)
    costs = re.findall(r"^Cost: .*$", output, flags=re.MULTILINE)
    runs = sorted((workdir / "job" / "wandb").glob("offline-run-*"))
    print("\n>>> Summary")
    print(f"Preempted, restarted by torchrun and resumed: {args.steps} steps in {elapsed:.0f} s.")
    print(banner.group(0).rstrip() if banner else "No resume banner: the job was never restarted.")
    print(costs[-1] if costs else "No cost summary.")
    print(f"Final weights {'bitwise IDENTICAL to' if identical else 'DIFFERENT from'} the uninterrupted run.")
    print(f"W&B offline run: {runs[-1] if runs else 'none'} (upload with `wandb sync {runs[-1] if runs else ''}`)")
    report = write_report(workdir / "job", workdir / "job" / "report.html")
    print(f"Run report: {workdir / 'job' / 'report.html'} ({len(report.attempts)} attempts; open it in a browser)")
    if not (identical and banner and costs and runs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
