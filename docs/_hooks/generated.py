"""MkDocs hook: the parts of the site that are generated, never hand-written.

- ``<!-- generated: benchmark summary -->``: the benchmark tables, from ``benchmarks/results/latest.json`` (what
  ``make bench`` writes), through the same function that renders them for ``benchmarks/run.py``'s summary.
- ``<!-- generated: layout -->``: the package's layout, one line per package and module, from their docstrings.
- ``<!-- generated: usage errors -->``: every usage error the package raises, read from its source, with the module
  that raises it: the messages name the problem and the fix.
"""

from __future__ import annotations

import ast
import html
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lightning_scale"
BENCHMARK_SUMMARY = "<!-- generated: benchmark summary -->"
LAYOUT = "<!-- generated: layout -->"
USAGE_ERRORS = "<!-- generated: usage errors -->"
USAGE_ERROR_TYPES = {
    "UsageError",
    "ConfigurationError",
    "ShardingPolicyError",
    "UnusableStorageError",
    "PriceCatalogError",
    "RankFailedUsageError",
}


def benchmark_summary() -> str:
    """The summary table, the runs it comes from and every benchmark's figures, from ``latest.json``."""
    if str(ROOT) not in sys.path:  # mkdocs' console script does not put the project on the path
        sys.path.insert(0, str(ROOT))
    from benchmarks.run import performance_page

    return performance_page(json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text()))


def _first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line ("" without one)."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(docstring.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def layout() -> str:
    """``lightning_scale/``'s packages and public modules, each with the first sentence of its docstring."""
    lines = ["| path | what it is |", "|---|---|"]
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if path.name == "__main__.py" or any(part.startswith("_") for part in relative.parts[1:-1]):
            continue
        if path.name == "__init__.py":
            shown = f"`{relative.parent}/`"
        elif path.name.startswith("_") or (path.parent != PACKAGE and path.parent.joinpath("__init__.py").exists()):
            continue  # private modules, and modules inside a package: the package's line speaks for them
        else:
            shown = f"`{relative}`"
        lines.append(f"| {shown} | {_first_sentence(path)} |")
    return "\n".join(lines)


def _message(node: ast.expr) -> str | None:
    """A raised message as the user reads it, each value computed at run time shown as ``<its expression>``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [_message(value) if isinstance(value, ast.Constant) else None for value in node.values]
        return "".join(
            part if part is not None else f"<{ast.unparse(value.value)}>"  # type: ignore[attr-defined]
            for part, value in zip(parts, node.values, strict=True)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _message(node.left), _message(node.right)
        return None if left is None or right is None else left + right
    return None


def usage_errors() -> str:
    """Every usage error raised in the package's source, grouped by module, as the user reads it."""
    sections = []
    for path in sorted(PACKAGE.rglob("*.py")):
        messages = []
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
                continue
            name = node.exc.func.id if isinstance(node.exc.func, ast.Name) else getattr(node.exc.func, "attr", "")
            message = _message(node.exc.args[0]) if name in USAGE_ERROR_TYPES else None
            if message:
                messages.append(f"- <samp>{html.escape(' '.join(message.split()))}</samp>")
        if messages:
            sections.append(f"### `{path.relative_to(ROOT)}`\n\n" + "\n".join(messages))
    return "\n\n".join(sections)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill in the generated parts of a page."""
    if BENCHMARK_SUMMARY in markdown:
        markdown = markdown.replace(BENCHMARK_SUMMARY, benchmark_summary())
    if LAYOUT in markdown:
        markdown = markdown.replace(LAYOUT, layout())
    if USAGE_ERRORS in markdown:
        markdown = markdown.replace(USAGE_ERRORS, usage_errors())
    return markdown
