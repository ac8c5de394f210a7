"""Our strategies in place of Lightning's (issue 20): every argument of the class each one extends is accepted by
name, from Python and from the command line, and what a Lightning ``Strategy`` promises after ``fit`` (collectives,
``validate`` on the same Trainer) holds as it does for stock ``ddp``."""

from __future__ import annotations

import inspect
import math

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies import ModelParallelStrategy as StockModelParallel

from lightning_scale.cli import main
from lightning_scale.strategies import DataParallelStrategy, ModelParallelStrategy, PipelineParallelStrategy
from tests.data.user_code import UserData, UserMLP

EXTENDS = {DataParallelStrategy: DDPStrategy, PipelineParallelStrategy: DDPStrategy,
           ModelParallelStrategy: StockModelParallel}  # fmt: skip


def stock_arguments(stock: type) -> dict:
    parameters = inspect.signature(stock.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}


@pytest.mark.parametrize("ours", EXTENDS, ids=lambda cls: cls.__name__)
def test_every_argument_of_the_stock_strategy_is_accepted_by_name(ours):
    arguments = stock_arguments(EXTENDS[ours])
    assert arguments
    for name, default in arguments.items():
        assert isinstance(ours(**{name: default}), EXTENDS[ours])


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("data_parallel", ["process_group_backend=gloo", "find_unused_parameters=true", "timeout=0:10:00"]),
        ("model_parallel", ["data_parallel_size=auto", "tensor_parallel_size=auto", "timeout=0:10:00"]),
        ("pipeline_parallel", ["process_group_backend=gloo", "timeout=0:10:00"]),
    ],
)
def test_the_command_line_takes_the_stock_arguments_too(capsys, name, flags):
    arguments = [f"--trainer.strategy.{flag}" for flag in flags]
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model=tests.data.user_code.UserMLP", "--trainer.strategy", name, *arguments, "--print_config"])
    printed = capsys.readouterr().out
    assert exit_.value.code in (0, None), printed
    for flag in flags:
        key, value = flag.split("=")
        assert f"      {key}: {value}" in printed.replace("'", ""), (flag, printed)


@pytest.mark.parametrize("argument", [{"find_unused_parameters": True}, {"model_averaging_period": 4}])
def test_pipeline_parallel_refuses_the_arguments_of_ddps_wrapper_with_the_reason(argument):
    with pytest.raises(ValueError, match=rf"does not wrap the model in DDP, so \['{next(iter(argument))}'\]"):
        PipelineParallelStrategy(**argument)
    PipelineParallelStrategy(find_unused_parameters=False, static_graph=False, dim=0)  # as the command line passes them


def test_a_data_parallel_size_that_does_not_fit_the_world_is_refused_before_training(tmp_path):
    trainer = Trainer(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(data_parallel_size=2), logger=False,
                      max_steps=1, default_root_dir=tmp_path, enable_progress_bar=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"data_parallel_size=2 times tensor_parallel_size=1 is not the world size 1"):
        trainer.fit(UserMLP(), datamodule=UserData({"loader": "torch", "shuffle": "shuffle_true"}))


@pytest.mark.multiprocess
@pytest.mark.parametrize("run", ["zero", "fsdp"])
def test_collectives_and_validate_after_fit_behave_as_with_stock_ddp(two_processes, run):
    ours, stock = two_processes[run]["contract"], two_processes["ddp"]["contract"]
    collectives = ["broadcast", "reduce_sum", "reduce_mean", "all_gather", "any_rank", "every_rank"]
    assert {key: ours[key] for key in collectives} == {key: stock[key] for key in collectives}
    assert stock["broadcast"] == "from rank 0" and stock["all_gather"] == [0, 1] and stock["reduce_sum"] == 3.0
    (metrics,), (stock_metrics,) = ours["validate"], stock["validate"]
    assert metrics.keys() == stock_metrics.keys() == {"val_loss"}
    assert math.isclose(metrics["val_loss"], stock_metrics["val_loss"], rel_tol=1e-4)
