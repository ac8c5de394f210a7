"""Checks of the house rules that a reader would otherwise have to trust (written out in CONTRIBUTING.md)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_scale"


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_distributed_module_imports_torch_distributed(path):
    if path.parent.name == "distributed":  # the package lightning_scale.distributed
        return
    allowed = set()
    folder = path.parent.relative_to(PACKAGE).as_posix()
    if folder == "parallel/pipeline":
        # torch's pipeline schedules are its own communication engine (point-to-point inside PipelineStage): the
        # engine builds them but calls no collective itself; its broadcasts and reductions go through distributed.py
        allowed = {"torch.distributed.pipelining"}
    if path.name == "sharded.py":
        # torch.distributed.checkpoint is torch's checkpoint engine (its planning gathers internally), called here
        allowed = {"torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict"}
    if path.name == "dcp_storage.py":
        # the same engine's file access (FileSystemBase), routed through a CheckpointStore
        allowed = {"torch.distributed.checkpoint", "torch.distributed.checkpoint.filesystem"}
    if path.name == "_torch_internals.py":
        # the private parts of torch's checkpoint engine and DDP hooks that sharded.py and compression.py use, and
        # the group timeout's setter that distributed.py uses
        allowed = {
            "torch.distributed.algorithms.ddp_comm_hooks.default_hooks",
            "torch.distributed.distributed_c10d",
            "torch.distributed.checkpoint",
            "torch.distributed.checkpoint._fsspec_filesystem",
            "torch.distributed.checkpoint.default_planner",
            "torch.distributed.checkpoint.filesystem",
            "torch.distributed.checkpoint.state_dict_loader",
        }
    if folder == "parallel/model":
        # FSDP2 and tensor parallelism: torch's engines, applied here, not collectives called
        allowed = {"torch.distributed.fsdp", "torch.distributed.tensor.parallel"}
    if folder == "parallel/data":
        # DDP communication hooks and ZeroRedundancyOptimizer: torch's engines, built here, not collectives called
        allowed = {"torch.distributed.algorithms.ddp_comm_hooks", "torch.distributed.optim"}
    imported = {name for name in imports_of(path) if name.startswith("torch.distributed")}
    assert imported <= allowed, imported - allowed


@pytest.mark.parametrize("package", ["checkpoint", "cost", "data", "parallel"])
def test_pure_logic_packages_do_not_import_lightning(package):
    for path in (PACKAGE / package).rglob("*.py"):
        assert not {name.split(".")[0] for name in imports_of(path)} & {"lightning", "pytorch_lightning"}, path


@pytest.mark.parametrize(
    "package",
    ["lightning_scale", "lightning_scale.callbacks", "lightning_scale.checkpoint", "lightning_scale.preemption"],
)
def test_packages_export_an_explicit_all(package):
    module = importlib.import_module(package)
    assert module.__all__ and all(hasattr(module, name) for name in module.__all__)


INTERNALS = {"_torch_internals.py", "_python_internals.py"}  # and the package _lightning_internals/


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_private_members_of_other_objects_are_reached_only_through_the_internals_modules(path):
    """``obj._name`` (or ``getattr(obj, "_name")`` and its kin) on anything but ``self``/``cls`` (or ``super()`` for
    a registered member), and private names imported from torch or Lightning, only in ``_lightning_internals.py``,
    ``_torch_internals.py`` and ``_python_internals.py``."""
    if path.name in INTERNALS or path.parent.name == "_lightning_internals":
        return
    from lightning_scale._lightning_internals import INHERITED_PRIVATE

    registered = {name for names in INHERITED_PRIVATE.values() for name in names}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and ast.unparse(base.func) == "super" and node.attr in registered:
                continue
            if ast.unparse(node) == "os._exit":  # a public function despite its name
                continue
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif _private_by_name(node):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("torch", "lightning"):
            private = [a.name for a in node.names if a.name.startswith("_")] + (
                [node.module] if any(part.startswith("_") for part in node.module.split(".")) else []
            )
            found += [f"line {node.lineno}: from {node.module} import {name}" for name in private]
    assert not found, found


def _private_by_name(node: ast.AST) -> bool:
    """``getattr``/``setattr``/``hasattr``/``delattr`` of a private name, given as a string, on another object."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
        return False
    target, name = node.args[0], node.args[1]
    return (
        node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        and isinstance(name, ast.Constant)
        and isinstance(name.value, str)
        and name.value.startswith("_")
        and not name.value.startswith("__")
        and not (isinstance(target, ast.Name) and target.id in ("self", "cls"))
    )


@pytest.mark.parametrize(
    ("source", "private"),
    [
        ("getattr(process, '_start_method', None)", True),
        ("setattr(trainer, '_x', 1)", True),
        ("getattr(self, '_cache', None)", False),
        ("getattr(module, '__wrapped__', None)", False),
        ("getattr(module, 'reset_parameters')", False),
    ],
)
def test_the_style_check_catches_a_private_name_reached_by_string(source, private):
    assert _private_by_name(ast.parse(source).body[0].value) is private  # type: ignore[attr-defined]


def _patches(source: str) -> list[str]:
    """Methods replaced on another object: ``obj.name = <a lambda, or a function defined in this module>``, or an
    assignment mypy itself calls one (``# type: ignore[method-assign]``)."""
    tree = ast.parse(source)
    functions = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if not isinstance(target, ast.Attribute):
                continue
            if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
                continue
            value = node.value
            replaces = isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in functions)
            if replaces or "method-assign" in lines[node.lineno - 1]:
                found.append(f"line {node.lineno}: {ast.unparse(target)} = {ast.unparse(value)}")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_methods_of_other_objects_are_replaced_only_through_the_internals_modules(path):
    """Every patch of a Lightning or torch object is catalogued in ``_lightning_internals`` (or ``_torch_internals``,
    ``_python_internals``), with a test that fails when the behaviour it relies on changes."""
    if path.name in INTERNALS or path.parent.name == "_lightning_internals":
        return
    assert _patches(path.read_text()) == []


@pytest.mark.parametrize(
    ("source", "patches"),
    [
        ("def save(*a):\n    pass\ntrainer.save_checkpoint = save", 1),
        ("module.configure_model = lambda: None", 1),
        ("plugin.clip = clip  # type: ignore[method-assign]", 1),
        ("self.on_step = lambda: None", 0),
        ("loader.worker_init_fn = ShieldFromJobSignals(signals)", 0),
        ("trainer.accumulate_grad_batches = 2", 0),
    ],
)
def test_the_style_check_catches_a_method_replaced_on_another_object(source, patches):
    assert len(_patches(source)) == patches


MODULE_LINES = 400  # any module of the package
CLI_MODULE_LINES = 200  # one job per module of lightning_scale/cli/
CLASS_LINES = {"callbacks/data_state.py": ("DataStateCheckpoint", 250)}  # glue over the data-state parts


def test_modules_and_the_glue_classes_stay_small_enough_to_read():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative, lines = path.relative_to(PACKAGE).as_posix(), len(path.read_text().splitlines())
        limit = CLI_MODULE_LINES if relative.startswith("cli/") else MODULE_LINES
        if lines > limit:
            too_long.append(f"{relative}: {lines} lines > {limit}")
    for relative, (name, limit) in CLASS_LINES.items():
        [node] = [n for n in ast.parse((PACKAGE / relative).read_text()).body if getattr(n, "name", None) == name]
        if node.end_lineno - node.lineno + 1 > limit:
            too_long.append(f"{relative}: class {name} is {node.end_lineno - node.lineno + 1} lines > {limit}")
    assert too_long == [], "split these into parts of their own (CONTRIBUTING.md):\n" + "\n".join(too_long)
