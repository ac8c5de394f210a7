"""Does a module keep its whole trained network in the one stack a pipeline splits? Checked before training; the
refusal names the parts outside and the layout that would work. No Lightning here."""

from __future__ import annotations

from torch import nn

from lightning_scale.errors import ConfigurationError

__all__ = ["checked_stack"]

_LISTED = 6  # parameter names shown in a message before "and N more"


def checked_stack(module: nn.Module, attribute: str) -> tuple[nn.Module, list[str]]:
    """``module.<attribute>`` and the names of the frozen parameters outside it (not trained, not in the pipeline's
    forward). Raises ``ValueError`` when there is no such attribute or a trainable parameter lies outside it."""
    stack = getattr(module, attribute, None)
    cls = type(module).__name__
    if not isinstance(stack, nn.Module):
        raise ConfigurationError(
            f"{cls} has no attribute {attribute!r} holding the stack of blocks to split. pipeline_parallel splits one "
            "nn.Sequential or nn.ModuleList that holds the whole network in the order forward() runs it (embedding "
            f"and head included); each child is a block, a stage a run of consecutive blocks. With {cls}'s parts: "
            f"self.{attribute} = {_stack_of(module, [name for name, _ in module.named_children()])}; or name the "
            "stack it already has with PipelineParallelStrategy(module=...) (--trainer.strategy.module)."
        )
    inside = {id(p) for p in stack.parameters()}
    outside = [(name, p) for name, p in module.named_parameters() if id(p) not in inside]
    trainable = [name for name, p in outside if p.requires_grad]
    if trainable:
        owners = {name.split(".", 1)[0] for name in trainable}
        parts = [name for name, child in module.named_children() if name in owners or child is stack]
        raise ConfigurationError(
            f"pipeline_parallel trains only {cls}.{attribute}, the stack it splits, but these trainable parameters "
            f"are outside it: {_listed(trainable)}. They would stay untrained, and the pipeline's forward would skip "
            "them. Move their modules into the stack in the order forward() uses them (a block may be any module: an "
            f"embedding first, a head last), e.g. self.{attribute} = {_stack_of(module, parts)} (in the order they "
            "were defined); or freeze them with .requires_grad_(False) if they are meant to stay fixed and forward() "
            "does not need them."
        )
    return stack, [name for name, p in outside if not p.requires_grad]


def _listed(names: list[str]) -> str:
    more = len(names) - _LISTED
    return ", ".join(names[:_LISTED]) + (f" and {more} more" if more > 0 else "")


def _stack_of(module: nn.Module, names: list[str]) -> str:
    """Python for one ``nn.Sequential`` of ``module``'s children ``names`` (stacks unpacked), in definition order."""
    children = dict(module.named_children())
    parts = [f"*self.{n}" if isinstance(children[n], (nn.Sequential, nn.ModuleList)) else f"self.{n}" for n in names]
    return f"nn.Sequential({', '.join(parts)})"
