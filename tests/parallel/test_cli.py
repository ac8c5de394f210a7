"""data_parallel's bad arguments refused at construction. The strategies through the ``lightning-scale`` command (the
shipped example configs with flags: model_parallel with tensor parallelism and bf16-mixed, data_parallel's init args
overridden, pipeline_parallel by registry name) train in tests/cli/test_command.py and tests/examples/test_demo.py."""

from __future__ import annotations

import pytest

from lightning_scale.strategies import DataParallelStrategy


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"zero_stage": 3},
            r"zero_stage=3: data_parallel shards the optimizer state \(1\), and the gradients \(2\).*model_parallel",
        ),
        ({"grad_compression": "int8"}, r"grad_compression='int8' is not one of \['none', 'fp16', 'bf16', 'powersgd'\]"),
        ({"grad_compression": "fp16", "ddp_comm_hook": print}, r"either grad_compression or ddp_comm_hook"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataParallelStrategy(**kwargs)


def test_bad_powersgd_settings_are_refused_at_construction_with_the_argument_to_change():
    with pytest.raises(ValueError, match=r"powersgd_warmup_steps=1 must be >= 2"):
        DataParallelStrategy(grad_compression="powersgd", powersgd_warmup_steps=1)
    with pytest.raises(ValueError, match=r"powersgd_rank=0 must be >= 1"):
        DataParallelStrategy(grad_compression="powersgd", powersgd_rank=0)
