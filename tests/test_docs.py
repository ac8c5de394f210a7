"""The README and the documentation site (``docs/``, built by ``make docs``) are checked like code.

The site builds with ``--strict`` (a broken link or anchor, a missing page, a snippet file or an API name that no
longer exists fails it), every public name of the package is in its API reference, and every command in the README
and the site (and in the SLURM and Kubernetes examples) is exercised: ``lightning-scale``/torchrun lines are parsed
by the real command with ``--print_config`` (every class path and argument checked, nothing trained), benchmark
scripts are the ones ``benchmarks/run.py`` runs (smoke-tested), ``make`` targets exist; Python snippets compile and
their imports resolve. Training through these commands is tested in tests/cli/test_command.py and by `make demo`."""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import lightning_scale
from benchmarks.registry import NAMES
from benchmarks.run import performance_page
from lightning_scale.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
SOURCES = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [README, *PAGES]}


def _hook():
    spec = importlib.util.spec_from_file_location("docs_generated", ROOT / "docs" / "_hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATED = _hook()


def blocks(text: str, language: str) -> list[str]:
    """The contents of the fenced code blocks opened with ```language."""
    found, current, opened = [], [], None
    for line in text.splitlines():
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


def shell_commands() -> list[tuple[str, list[str]]]:
    """(file, command line) of the shell blocks (and of plain blocks, which also hold program output, skipped)."""
    starts = ("make ", "torchrun ", "lightning-scale ", ".venv/bin/python ", "TORCH_")
    commands = []
    for name, text in SOURCES.items():
        for block in [*blocks(text, "bash"), *blocks(text, "")]:
            for line in block.splitlines():
                if line.startswith(starts):
                    words = shlex.split(line, comments=True)
                    commands.append((name, words[: words.index(">")] if ">" in words else words))
    return commands


def cli_arguments(words: list[str]) -> list[str]:
    """The ``lightning-scale`` arguments of a command line (after ``-m lightning_scale`` or ``lightning-scale``)."""
    for marker in (["-m", "lightning_scale"], ["lightning-scale"]):
        for i in range(len(words)):
            if words[i : i + len(marker)] == marker:
                return words[i + len(marker) :]
    raise AssertionError(f"not a lightning-scale command: {words}")


def parses(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``lightning-scale fit ... --print_config`` exits 0 and prints a config (``consolidate``, ``report``: their
    ``--help``)."""
    subcommand = arguments[0] in ("consolidate", "report")
    with pytest.raises(SystemExit) as exit_:
        main([*(arguments[:1] if subcommand else arguments), "--help" if subcommand else "--print_config"])
    out, err = capsys.readouterr()
    assert exit_.value.code in (0, None), f"{shlex.join(arguments)}\n{err[-2000:]}"
    assert subcommand or yaml.safe_load(out)["trainer"], out[-2000:]


COMMANDS = shell_commands()


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    text = SOURCES["README.md"]
    first = [line.split("#")[0].strip() for line in blocks(text, "bash")[0].splitlines()]
    assert first == ["make demo", "make test"], first
    assert len(text.splitlines()) <= 250


def test_the_readme_links_into_the_site_and_every_link_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", SOURCES["README.md"])
    assert sum(link.startswith("docs/") for link in links) >= 15, links
    assert [link for link in links if "://" not in link and not (ROOT / link).exists()] == []


def test_the_docs_document_commands():
    words = [command for _, command in COMMANDS]
    assert ["make", "demo"] in words and ["make", "test"] in words and ["make", "docs"] in words
    assert sum("fit" in c for c in words) >= 8


@pytest.mark.parametrize(("page", "words"), COMMANDS, ids=[f"{p}: {' '.join(c)[:50]}" for p, c in COMMANDS])
def test_each_documented_command_runs(page, words, capsys):
    if words[0] == "make":
        assert re.search(rf"^{words[1]}:", (ROOT / "Makefile").read_text(), flags=re.MULTILINE), words
    elif words[0] == ".venv/bin/python":  # a benchmark: benchmarks.run runs each (smoke-tested in tests/benchmarks/)
        assert words[1] == "-m" and words[2].startswith("benchmarks."), words
        assert words[2].removeprefix("benchmarks.") in (*NAMES, "run", "gpu_snapshot", "gpu_strategies"), words
    elif words[0] == "torchrun" and words[-1].endswith(".py"):  # a user's script: the file exists
        assert (ROOT / words[-1]).is_file() or words[-1] == "train.py", words
    else:
        parses(cli_arguments(words), capsys)


def inline_flags() -> list[str]:
    """Flags with values that prose and tables show inline (`--trainer.strategy data_parallel ...`), placeholders
    (``...``, an upper-case word) left out."""
    text = " ".join(" ".join(SOURCES.values()).split())
    spans = re.findall(r"`(--(?:trainer|checkpoint|cost|preemption|config)[^`]*)`", text)
    return sorted({span for span in spans if " " in span or "=" in span} - {span for span in spans if
                   "..." in span or re.search(r"(^| )[A-Z]+( |$)", span)})  # fmt: skip


INLINE = inline_flags()


def test_the_docs_show_inline_flags():
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


SNIPPETS = [(name, snippet) for name, text in SOURCES.items() for snippet in blocks(text, "python")]


@pytest.mark.parametrize(("page", "snippet"), SNIPPETS, ids=[f"{p} #{i}" for i, (p, _) in enumerate(SNIPPETS)])
def test_python_snippets_compile_and_their_imports_resolve(page, snippet):
    if snippet.startswith("--8<--"):  # a file included by the site's build, which fails if it is missing
        return
    compile(snippet, f"{page} python block", "exec")
    ours = r"(from (lightning_scale|lightning|torch)\S* import |import (lightning_scale|lightning|torch)\b)"
    imports = "\n".join(line for line in snippet.splitlines() if re.match(ours, line))  # not the user's modules
    exec(imports, {})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as ``make docs`` builds it, with ``--strict``."""
    out = tmp_path_factory.mktemp("site")
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def public_packages() -> dict[str, list[str]]:
    """Every public module of the package that declares ``__all__``, with its names."""
    found = {"lightning_scale": list(lightning_scale.__all__)}
    for info in pkgutil.walk_packages(lightning_scale.__path__, "lightning_scale."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "__all__") and (info.ispkg or info.name.count(".") == 1):
            found[info.name] = list(module.__all__)
    return found


def test_every_public_name_of_the_package_is_in_the_api_reference(site):
    reference = " ".join(p.read_text() for p in (site / "reference").rglob("*.html"))
    documented = set(re.findall(r'id="(lightning_scale[\w.]*)"', reference))
    packages = public_packages()
    assert len(packages) >= 15, packages
    missing = [
        f"{module}.{name}"
        for module, names in packages.items()
        for name in names
        if f"{module}.{name}" not in documented
        and not (module == "lightning_scale" and any(f"{m}.{name}" in documented for m in packages))
        and name != "__version__"
    ]
    assert missing == []


def test_the_performance_page_is_generated_from_the_latest_full_benchmark_run(site):
    latest = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
    assert latest["quick"] is False and set(latest["results"]) == set(NAMES)
    assert performance_page(latest) in GENERATED.on_page_markdown(SOURCES["docs/performance.md"], page=None)
    page = (site / "performance" / "index.html").read_text()
    assert all(row["figure"] in page for row in latest["summary"])


def test_no_measured_figure_lives_outside_the_generated_tables():
    """Benchmark figures come from ``latest.json`` only: the Performance page's prose states none (its targets and
    the step length that separates two of them are definitions, not figures), and no page quotes a measured spread
    ("median (min-max)")."""
    prose = re.sub(r"```.*?```", "", SOURCES["docs/performance.md"], flags=re.DOTALL)
    figures = []
    for found in re.finditer(r"(?<![\w.])(\d+(?:\.\d+)*)(?: ?(?:ms|s|MB|GB|%|\u00d7)(?!\w))?", prose):
        value = found.group(1)
        target = prose[max(0, found.start() - 2) : found.start()].strip() in ("≤", "≥")
        if not target and value.count(".") <= 1 and ("." in value or found.group(0) != value):  # not an address
            figures.append(found.group(0))
    assert [f for f in figures if f != "20 ms"] == [], "state measured figures in benchmarks/_readme_details.py"
    spread = r"\d+\.\d+ \(\d+(?:\.\d+)?[\u2013-]\d+(?:\.\d+)?\)"
    assert [
        name for name, text in SOURCES.items() if re.search(spread, re.sub(r"```.*?```", "", text, flags=re.S))
    ] == []


def test_troubleshooting_lists_every_usage_error_the_package_raises(site):
    page = (site / "troubleshooting" / "index.html").read_text()
    raised = sum(len(re.findall(r"raise \w*Error\(", p.read_text())) for p in (ROOT / "lightning_scale").rglob("*.py"))
    assert page.count("<samp>") >= 100 and raised >= page.count("<samp>")
    assert "keep_last_k=&lt;keep_last_k&gt; must be &gt;= 1" in page


def test_the_layout_is_generated_from_every_package(site):
    page = (site / "development" / "index.html").read_text()
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "lightning_scale").rglob("__init__.py")}
    assert [p for p in packages if not p.split("/")[-1].startswith("_") and f"{p}/" not in page] == []
