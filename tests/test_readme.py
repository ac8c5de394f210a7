"""Every command in the README (and in the SLURM and Kubernetes examples) is exercised: ``lightning-scale``/torchrun
lines are parsed by the real command with ``--print_config`` (every class path and argument checked, nothing trained),
benchmark scripts are the ones ``benchmarks/run.py`` runs (smoke-tested), ``make`` targets exist; Python snippets
compile and their imports resolve. Training through these commands is tested in tests/test_cli.py and by `make demo`."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from lightning_scale.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from run import BENCHMARKS, MARKERS, readme_block

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    """The contents of the fenced code blocks opened with ```language."""
    found, current, opened = [], [], None
    for line in README.splitlines():
        if line.startswith("```"):
            if opened is None:
                opened, current = line[3:].strip(), []
            else:
                if opened == language:
                    found.append("\n".join(current))
                opened = None
        elif opened is not None:
            current.append(line)
    return found


def shell_commands() -> list[list[str]]:
    """Command lines of the shell blocks (and of plain blocks, which also hold program output, skipped)."""
    starts = ("make ", "torchrun ", "lightning-scale ", ".venv/bin/python ", "TORCH_")
    commands = []
    for block in [*blocks("bash"), *blocks("")]:
        for line in block.splitlines():
            if line.startswith(starts):
                words = shlex.split(line, comments=True)
                commands.append(words[: words.index(">")] if ">" in words else words)
    return commands


def cli_arguments(words: list[str]) -> list[str]:
    """The ``lightning-scale`` arguments of a command line (after ``-m lightning_scale`` or ``lightning-scale``)."""
    for marker in (["-m", "lightning_scale"], ["lightning-scale"]):
        for i in range(len(words)):
            if words[i : i + len(marker)] == marker:
                return words[i + len(marker) :]
    raise AssertionError(f"not a lightning-scale command: {words}")


def parses(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``lightning-scale fit ... --print_config`` exits 0 and prints a config (or ``consolidate --help``)."""
    extra = ["--help"] if arguments[0] == "consolidate" else ["--print_config"]
    with pytest.raises(SystemExit) as exit_:
        main([*(arguments[:1] if arguments[0] == "consolidate" else arguments), *extra])
    out, err = capsys.readouterr()
    assert exit_.value.code in (0, None), f"{shlex.join(arguments)}\n{err[-2000:]}"
    assert arguments[0] == "consolidate" or yaml.safe_load(out)["trainer"], out[-2000:]


COMMANDS = shell_commands()


def test_the_readme_documents_commands():
    assert ["make", "demo"] in COMMANDS and ["make", "test"] in COMMANDS
    assert sum("fit" in c for c in COMMANDS) >= 8


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_each_readme_command_runs(words, capsys):
    if words[0] == "make":
        assert re.search(rf"^{words[1]}:", (ROOT / "Makefile").read_text(), flags=re.MULTILINE), words
    elif words[0] == ".venv/bin/python":  # a benchmark: run.py runs each (smoke-tested in tests/test_benchmarks.py)
        script = Path(words[1]).stem
        assert (ROOT / words[1]).is_file() and (script == "run" or script in BENCHMARKS), words
    else:
        parses(cli_arguments(words), capsys)


def inline_flags() -> list[str]:
    """Flags with values that the README's prose and tables show inline (`--trainer.strategy data_parallel ...`),
    placeholders (``...``, an upper-case word) left out."""
    spans = re.findall(r"`(--(?:trainer|checkpoint|cost|preemption|config)[^`]*)`", " ".join(README.split()))
    return sorted({span for span in spans if " " in span or "=" in span} - {span for span in spans if
                   "..." in span or re.search(r"(^| )[A-Z]+( |$)", span)})  # fmt: skip


INLINE = inline_flags()


def test_the_readme_shows_inline_flags():
    assert len(INLINE) >= 10 and "--trainer.strategy data_parallel --trainer.strategy.zero_stage 1" in INLINE


@pytest.mark.parametrize("flags", INLINE)
def test_each_inline_flag_form_parses_on_top_of_the_example_config(flags, capsys):
    parses(["fit", "--config", "examples/configs/data_parallel.yaml", *shlex.split(flags)], capsys)


def test_the_slurm_and_kubernetes_examples_run_valid_commands(tmp_path, capsys):
    sbatch = (ROOT / "examples" / "slurm" / "train.sbatch").read_text().replace("\\\n", " ")
    [line] = [line for line in sbatch.splitlines() if "-m lightning_scale" in line]
    values = {"$SLURM_NNODES": "2", "$SLURM_NTASKS_PER_NODE": "1", "$CKPT_DIR": str(tmp_path),
              "$NOTICE": str(tmp_path / "notice")}  # fmt: skip
    words = [values.get(w, w) for w in shlex.split(line.replace('"', "").rstrip(" &")) if w != "$@"]
    parses(cli_arguments(words), capsys)
    job = yaml.safe_load((ROOT / "examples" / "kubernetes" / "job.yaml").read_text())
    [container] = job["spec"]["template"]["spec"]["containers"]
    parses(cli_arguments(container["command"]), capsys)


@pytest.mark.parametrize("number", range(len(blocks("python"))))
def test_python_snippets_compile_and_their_imports_resolve(number):
    snippet = blocks("python")[number]
    compile(snippet, f"README python block {number}", "exec")
    ours = r"(from (lightning_scale|lightning|torch)\S* import |import (lightning_scale|lightning|torch)\b)"
    imports = "\n".join(line for line in snippet.splitlines() if re.match(ours, line))  # not the user's modules
    exec(imports, {})


def test_the_performance_table_is_the_latest_full_benchmark_run():
    latest = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
    assert latest["quick"] is False and set(latest["results"]) == set(BENCHMARKS)
    assert readme_block(latest) in README, "re-run `make bench` (it rewrites the README's summary table)"


def outside_the_generated_tables(text: str) -> str:
    """``text`` without the block ``benchmarks/run.py`` generates and without code blocks."""
    start, end = text.find(MARKERS[0]), text.find(MARKERS[1])
    if start >= 0:
        text = text[:start] + text[end + len(MARKERS[1]) :]
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def test_no_measured_figure_in_the_readme_lives_outside_the_generated_tables():
    """Benchmark figures come from ``latest.json`` only: the Performance section's prose states none (its targets and
    the step length that separates two of them are definitions, not figures), and no other section quotes a measured
    spread ("median (min-max)")."""
    start = README.index("## Performance")
    section = README[start : README.index("\n## ", start)]
    prose = outside_the_generated_tables(section)
    figures = []
    for found in re.finditer(r"(?<![\w.])(\d+(?:\.\d+)*)(?: ?(?:ms|s|MB|GB|%|\u00d7)(?!\w))?", prose):
        value = found.group(1)
        target = prose[max(0, found.start() - 2) : found.start()].strip() in ("≤", "≥")
        if not target and value.count(".") <= 1 and ("." in value or found.group(0) != value):  # not an address
            figures.append(found.group(0))
    assert [f for f in figures if f != "20 ms"] == [], "state measured figures in benchmarks/_readme_details.py"
    spreads = re.findall(r"\d+\.\d+ \(\d+(?:\.\d+)?[\u2013-]\d+(?:\.\d+)?\)", outside_the_generated_tables(README))
    assert spreads == [], spreads
