"""Time to resume: seconds from process start to the first training step, starting fresh vs resuming a checkpoint
from local disk vs from an S3-protocol server (moto, on 127.0.0.1, started here).

Each measurement is a new Python process (imports, model construction, checkpoint discovery, validation by sha256,
download and load included). The three variants are interleaved and repeated; medians (min-max). Writes
``benchmarks/results/resume_time.json``.

    .venv/bin/python -m benchmarks.resume_time [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks._common import machine_info, spread
from benchmarks._summary import (
    Row,
    md_s,
    span_of,
    summary_row,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
VARIANTS = ("fresh", "local", "s3")


def s3_server() -> tuple[object, dict[str, str]]:
    """A moto S3 server on 127.0.0.1 and the environment that points a child process's fsspec/s3fs at it."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "FSSPEC_S3_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "benchmark",
        "AWS_SECRET_ACCESS_KEY": "benchmark",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1",
    }
    return server, env


def run_job(dirpath: str, state_mb: float, max_steps: int, workdir: Path, env: dict[str, str]) -> dict[str, float]:
    out = workdir / f"first-step-{uuid.uuid4().hex[:8]}.json"
    command = [sys.executable, "-m", "benchmarks._resume_job", dirpath, str(state_mb), str(max_steps), str(out)]
    started = time.time()
    subprocess.run(
        command,
        check=True,
        capture_output=True,
        env={**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    first = json.loads(out.read_text())
    return {"seconds": first["first_step_unix"] - started, "global_step": first["global_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 20 MB state, 1 repeat (smoke test)")
    parser.add_argument("--out", default=str(RESULTS / "resume_time.json"), help="where to write the JSON")
    args = parser.parse_args()
    state_mb, repeats = (20.0, 1) if args.quick else (200.0, 5)

    server, env = s3_server()
    import fsspec

    bucket = f"resume-{uuid.uuid4().hex[:8]}"
    s3 = fsspec.filesystem("s3", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], key="benchmark", secret="benchmark")
    s3.mkdir(bucket)
    workdir = Path(tempfile.mkdtemp(prefix="resume-time-"))
    dirpaths = {"local": str(workdir / "ckpt"), "s3": f"s3://{bucket}/run"}
    try:
        run_job(dirpaths["local"], state_mb, 2, workdir, env)  # a checkpoint at step 2 to resume from ...
        s3.put(dirpaths["local"], dirpaths["s3"], recursive=True)  # ... and the same files on the S3 server
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for _ in range(repeats):
            for variant in VARIANTS:
                dirpath = dirpaths.get(variant, str(workdir / f"fresh-{uuid.uuid4().hex[:8]}"))
                result = run_job(dirpath, state_mb, 3, workdir, env)  # resumes at step 2, stops after step 3
                expected_step = 0 if variant == "fresh" else 2
                if result["global_step"] != expected_step:
                    raise RuntimeError(f"{variant}: first step at global step {result['global_step']}")
                runs[variant].append(result)  # no save at step 3: every repeat resumes the same step-2 checkpoint
    finally:
        server.stop()  # type: ignore[attr-defined]
        shutil.rmtree(workdir, ignore_errors=True)

    table = {v: spread([r["seconds"] for r in runs[v]]) for v in VARIANTS}
    print(f"time from process start to the first training step, {state_mb:.0f} MB state, {repeats} repeats, CPU")
    for variant in VARIANTS:
        row = table[variant]
        extra = "" if variant == "fresh" else f"  (+{row['median'] - table['fresh']['median']:.2f} s over fresh)"
        print(f"{variant:<6} {row['median']:6.2f} s ({row['min']:.2f}-{row['max']:.2f}){extra}")
    out = Path(args.out)
    config = {"state_mb": state_mb, "repeats": repeats, "quick": args.quick}
    out.write_text(json.dumps({"machine": machine_info(), "config": config, "table": table, "runs": runs}, indent=1))
    print(f"wrote {out}")


def rows(result: dict) -> list[Row]:
    """The summary rows of ``result`` (this script's JSON), each with its target and verdict."""
    table, mb = result["table"], result["config"]["state_mb"]
    return [
        summary_row("resume_time", f"process start → first training step, {mb:.0f} MB state, {variant}",
            table[variant]["median"], span_of(table[variant]), "s")
        for variant in ("fresh", "local")
    ]  # fmt: skip


def details(result: dict) -> str:
    """This benchmark's figures in Markdown, for the Performance page."""
    table = result["table"]
    return (
        f"Process start to the first training step, {result['config']['state_mb']:.0f} MB state, s: fresh "
        f"{md_s(table['fresh'])}, resumed from local disk {md_s(table['local'])}, from S3 (moto on 127.0.0.1) "
        f"{md_s(table['s3'])}."
    )


if __name__ == "__main__":
    main()
