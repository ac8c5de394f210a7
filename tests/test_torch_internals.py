"""The private parts of torch that ``lightning_scale._torch_internals`` wraps still exist and still behave as used."""

from __future__ import annotations

import torch

from lightning_scale import _torch_internals as internals


def test_the_wrapped_private_members_import_and_behave_as_used(tmp_path):
    import torch.distributed.checkpoint as dcp

    assert internals.tree_leaves({"a": [torch.ones(1), 2]})[1] == 2
    assert len(internals.tree_flatten((torch.ones(1), {"b": 3}))[0]) == 2
    state = {"w": torch.arange(4.0)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    loaded: dict = {}
    internals.load_state_dict_in_one_process(loaded, dcp.FileSystemReader(str(tmp_path)))
    assert torch.equal(loaded["w"], state["w"])
    assert callable(internals.compress_hook) and internals.FsspecReader
    writer = dcp.FileSystemWriter(str(tmp_path / "unused"))
    files = dcp.FileSystemWriter(str(tmp_path)).fs
    assert internals.files_through(writer, files, "elsewhere") is writer
    assert writer.fs is files and writer.path == "elsewhere"  # the attributes DCP's writer reads its files through
    assert callable(internals.set_process_group_timeout)  # used on a live group by tests/callbacks/test_hang_watchdog


def test_a_callback_queued_from_a_gradient_hook_runs_once_after_every_gradient_is_accumulated():
    first, second = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    events: list[str] = []

    def hook(param: torch.Tensor) -> None:
        events.append(f"grad {param.numel()}")
        if len(events) == 1:
            internals.at_end_of_backward(lambda: events.append("end"))

    for param in (first, second):
        param.register_post_accumulate_grad_hook(hook)
    ((first * 2).sum() + (second * 3).sum()).backward()
    assert sorted(events[:2]) == ["grad 2", "grad 3"] and events[2:] == ["end"]


def test_parameter_initialiser_finds_the_public_and_the_private_reset():
    assert internals.parameter_initialiser(torch.nn.Linear(2, 2)) is not None
    attention = torch.nn.MultiheadAttention(4, 2)
    assert not hasattr(attention, "reset_parameters") and internals.parameter_initialiser(attention)
    assert internals.parameter_initialiser(torch.nn.ReLU()) is None
