"""Checks of the house rules that a reader would otherwise have to trust (see shared/STYLE.md)."""

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
    if path.name == "distributed.py":
        return
    allowed = set()
    if path.name == "pipeline_parallel.py":
        # torch's pipeline schedules are its own communication engine (point-to-point inside PipelineStage): the
        # strategy builds them but calls no collective itself; its broadcasts and reductions go through distributed.py
        allowed = {"torch.distributed.pipelining"}
    if path.name == "sharded.py":
        # torch.distributed.checkpoint is torch's checkpoint engine (its planning gathers internally), called here
        allowed = {
            "torch.distributed.checkpoint",
            "torch.distributed.checkpoint._fsspec_filesystem",
            "torch.distributed.checkpoint.default_planner",
            "torch.distributed.checkpoint.state_dict_loader",
        }
    if path.parent.name == "model_parallel":
        # FSDP2 and tensor parallelism: torch's engines, applied here, not collectives called
        allowed = {"torch.distributed.fsdp", "torch.distributed.tensor.parallel"}
    if path.parent.name == "data_parallel":
        # DDP communication hooks and ZeroRedundancyOptimizer: torch's engines, built here, not collectives called
        allowed = {"torch.distributed.algorithms.ddp_comm_hooks", "torch.distributed.optim"}
    imported = {name for name in imports_of(path) if name.startswith("torch.distributed")}
    assert imported <= allowed, imported - allowed


@pytest.mark.parametrize("package", ["checkpoint", "cost", "data", "data_parallel", "model_parallel", "pipeline"])
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
