"""The ``lightning-scale`` command (LightningCLI): default callbacks, every callback by class path, ``--print_config``
round trip, ``consolidate``, bad input refused with the CLI's own errors, usage errors found while the job runs, and
the three strategies' example configs trained on 2 processes with flags on top."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from lightning.pytorch import Callback

from examples.char_transformer import CharTransformer
from lightning_scale.checkpoint.manifest import manifest_name
from lightning_scale.cli import main
from lightning_scale.errors import USAGE_ERROR_EXIT_CODE, ConfigurationError
from lightning_scale.report.wandb_offline import history_values, read_records
from lightning_scale.testing import launch_command, launch_environment
from tests.data.user_code import UserMLP

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ["--model=examples.char_transformer.CharTransformer", "--model.vocab_size=64",
           "--data=examples.char_transformer.CharDataModule"]  # fmt: skip
QUICK = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.max_steps=6", "--trainer.limit_val_batches=2",
         "--trainer.val_check_interval=3", "--trainer.enable_model_summary=false"]  # fmt: skip


def lightning_scale(tmp_path: Path, *args: str, console_script: bool = False) -> subprocess.CompletedProcess:
    """Run the command from the checkout (so ``examples.…`` class paths resolve), writing only under ``tmp_path``."""
    entry = (
        [str(Path(sys.executable).parent / "lightning-scale")]
        if console_script
        else [sys.executable, "-m", "lightning_scale"]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    return subprocess.run([*entry, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def output(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``lightning-scale ARGS`` in this process, for commands that end before training (``--print_config``, bad
    input): its exit code, stdout and stderr. A launch would cost ~5 s of imports for the same parser."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code or 0, out, err


def test_default_callbacks_are_on_and_every_callback_can_be_added_by_class_path(tmp_path):
    done = lightning_scale(
        tmp_path, "fit", *EXAMPLE, *QUICK,
        f"--trainer.default_root_dir={tmp_path}",
        f"--checkpoint.dirpath={tmp_path / 'ckpts'}", "--checkpoint.every_n_train_steps=3",
        "--cost.price_per_hour=2.5",
        "--trainer.logger=lightning.pytorch.loggers.WandbLogger", "--trainer.logger.offline=true",
        f"--trainer.logger.save_dir={tmp_path}", "--trainer.logger.project=cli-test",
        "--trainer.callbacks+=lightning_scale.callbacks.BudgetedEarlyStopping",
        "--trainer.callbacks.monitor=val_loss", "--trainer.callbacks.max_cost_usd=100",
        "--trainer.callbacks+=lightning_scale.callbacks.DivergenceRollback", "--trainer.callbacks.max_rollbacks=1",
        "--trainer.callbacks+=lightning_scale.callbacks.DataStateCheckpoint",
        "--trainer.callbacks+=lightning_scale.callbacks.WandbResume",
        "--trainer.callbacks+=lightning_scale.callbacks.SpotPreemption",
        "--trainer.callbacks.sources+=lightning_scale.preemption.FileNotice",
        f"--trainer.callbacks.sources.path={tmp_path / 'notice'}",
    )  # fmt: skip
    assert done.returncode == 0, output(done)[-4000:]
    assert "`Trainer.fit` stopped: `max_steps=6` reached." in output(done)
    assert sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt")) == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    assert "Cost: $" in output(done) and "for 6 steps" in output(done)  # CostTracker's summary
    [run_file] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert [float(v) > 0 for v in history_values(read_records(run_file), "cost/usd_total")][-1:] == [True]


def test_a_second_run_of_the_same_command_resumes_with_the_banner(tmp_path):
    def command(max_steps: int) -> list[str]:
        return ["fit", *EXAMPLE, *QUICK, f"--trainer.max_steps={max_steps}", f"--trainer.default_root_dir={tmp_path}",
                "--trainer.logger=false", f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
                "--checkpoint.every_n_train_steps=3", "--cost.price_per_hour=2.5"]  # fmt: skip

    assert lightning_scale(tmp_path, *command(6)).returncode == 0
    done = lightning_scale(tmp_path, *command(9))
    assert done.returncode == 0, output(done)[-4000:]
    assert "Auto-resuming from" in output(done) and "epoch=0-step=6.ckpt (global step 6" in output(done)
    assert "  Steps lost: 0 (the previous attempt ended at step 6)." in output(done)
    assert "  Cost so far: $" in output(done)


def test_defaults_can_be_switched_off_and_print_config_is_a_valid_config(tmp_path, capsys):
    code, printed, err = in_process(capsys, "fit", *EXAMPLE, *QUICK, "--cost=null", "--preemption=null",
                                    f"--checkpoint.dirpath={tmp_path / 'ckpts'}", "--print_config")  # fmt: skip
    assert code == 0, err[-4000:]
    config = yaml.safe_load(printed)
    assert config["cost"] is None and config["preemption"] is None
    assert config["checkpoint"]["class_path"] == "lightning_scale.ResumableCheckpoint"
    path = tmp_path / "config.yaml"
    path.write_text(printed)
    again = lightning_scale(tmp_path, "fit", f"--config={path}", f"--trainer.default_root_dir={tmp_path}",
                            "--trainer.logger=false")  # fmt: skip
    assert again.returncode == 0, output(again)[-4000:]
    assert "Cost: $" not in output(again)
    assert (tmp_path / "ckpts").is_dir()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--trainer.strategy=pipeline_paralel"],
            r"'pipeline_paralel' is not a registered strategy; choose one of: .*model_parallel.*pipeline_parallel",
        ),
        (["--checkpoint.every_n_train_step=3"], r"Option 'every_n_train_step' is not accepted"),
        (["--trainer.max_stepz=3"], r"unrecognized arguments: --trainer.max_stepz=3"),
        (
            ["--cost.price_per_hour=null"],
            r"--cost needs the price of one node: --cost.price_per_hour 3.2, .*--cost null",
        ),
        (["--checkpoint.keep_last_k=0"], r"keep_last_k=0 must be >= 1"),
    ],
    ids=["unknown-strategy", "unknown-callback-arg", "unknown-trainer-arg", "no-price", "bad-value"],
)
def test_bad_input_is_a_usage_error_not_a_traceback(tmp_path, capsys, args, message):
    dirpath = tmp_path / "ckpts"
    code, _, err = in_process(capsys, "fit", *EXAMPLE, *QUICK, f"--checkpoint.dirpath={dirpath}",
                              "--cost.price_per_hour=1", *args)  # fmt: skip
    assert code == 2 and re.search(message, err), err[-3000:]  # an exception would have failed the test
    assert not dirpath.exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainer.strategy=pipeline_parallel", "--trainer.strategy.n_microbatches=0"], "n_microbatches=0 must be"),
        (["--trainer.strategy=model_parallel", "--trainer.strategy.tensor_parallel_size=0"], "tensor_parallel_size=0"),
        (["--trainer.strategy=data_parallel", "--trainer.strategy.zero_stage=1",
          "--trainer.strategy.grad_compression=powersgd"], "grad_compression='powersgd' cannot act"),
        (["--trainer.strategy=pipeline_paralel"], "'pipeline_paralel' is not a registered strategy"),
        (["--checkpoint.dirpath=foo://bucket/run"], "Cannot open dirpath='foo://bucket/run': Protocol not known"),
        (["--checkpoint.every_n_train_steps=-5"], "every_n_train_steps=-5 must be >= 1"),
        (["--trainer.callbacks+=lightning_scale.callbacks.BudgetedEarlyStopping",
          "--trainer.callbacks.max_cost_usd=-5"], "max_cost_usd"),
    ],
    ids=["pipeline", "model", "data", "unknown-strategy", "dirpath", "cadence", "added-callback"],
)  # fmt: skip
def test_an_argument_refused_by_a_strategy_or_callback_is_one_line_not_a_traceback(tmp_path, capsys, args, message):
    """jsonargparse folds an error raised while building ``--trainer.strategy`` or a callback (union types) into its
    own, with a traceback: the command finds the class's usage error again and reports that alone."""
    code, out, err = in_process(capsys, "fit", *EXAMPLE, *QUICK, f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
                                "--cost.price_per_hour=1", *args)  # fmt: skip
    lines = [line for line in (out + err).splitlines() if line.startswith("lightning-scale: error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], out[-2000:] + err[-3000:]
    assert "Traceback" not in err and "usage:" not in err


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, r"--ckpt_path \S+ does not exist"), (b"\x00" * 100, r"--ckpt_path \S+ cannot be loaded \(")],
    ids=["missing", "damaged"],
)
def test_a_ckpt_path_that_is_missing_or_does_not_load_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "given.ckpt"
    if content is not None:
        path.write_bytes(content)
    code, _, err = in_process(capsys, "fit", *EXAMPLE, *QUICK, f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
                                "--cost.price_per_hour=1", f"--ckpt_path={path}")  # fmt: skip
    lines = [line for line in err.splitlines() if line.startswith("lightning-scale: error:")]
    assert code == 2 and len(lines) == 1 and re.search(message, lines[0]), err[-3000:]
    assert "Traceback" not in err and not (tmp_path / "ckpts").exists()


def test_model_arguments_the_checkpoints_hyperparameters_replace_are_named(tmp_path, capsys):
    """LightningCLI builds the model of a ``--ckpt_path`` run with the checkpoint's hyperparameters, also over a value
    given on the command line: the command says which, before anything is built (here a missing price stops it)."""
    path = tmp_path / "given.ckpt"
    hyperparameters = {"_class_path": "examples.char_transformer.CharTransformer", "vocab_size": 64, "lr": 0.5}
    torch.save({"hyper_parameters": hyperparameters}, path)  # as the command's own runs save them
    with pytest.warns(UserWarning) as warned:
        code, _, err = in_process(capsys, "fit", *EXAMPLE, *QUICK, f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
                                  f"--ckpt_path={path}", "--model.lr=0.01", "--cost.price_per_hour=null")  # fmt: skip
    assert code == 2 and "--cost needs the price of one node" in err, err[-3000:]
    [message] = [str(w.message) for w in warned if "hyperparameters" in str(w.message)]
    assert message == (
        f"--ckpt_path {path}: the model is built with the checkpoint's hyperparameters, which replace these model "
        "arguments: lr 0.01 -> 0.5."
    )  # vocab_size is the same in both: not named


def test_consolidate_writes_one_file_that_loads_into_the_model_and_names_a_damaged_file(tmp_path, capsys):
    done = lightning_scale(tmp_path, "fit", *EXAMPLE, *QUICK, "--cost=null", "--trainer.logger=false",
                           f"--trainer.default_root_dir={tmp_path}", f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
                           "--checkpoint.sharded=true", "--checkpoint.every_n_train_steps=6")  # fmt: skip
    assert done.returncode == 0, output(done)[-4000:]
    [sharded] = (tmp_path / "ckpts").glob("*.ckpt")
    assert sharded.is_dir()
    done = lightning_scale(tmp_path, "consolidate", str(sharded), str(tmp_path / "one.ckpt"), console_script=True)
    assert done.returncode == 0, output(done)[-3000:]
    state = torch.load(tmp_path / "one.ckpt", weights_only=False)["state_dict"]
    CharTransformer(vocab_size=64).load_state_dict(state, strict=True)

    # without its manifest (as Lightning's own model_parallel writes it), a damaged meta.pt is read and refused
    (sharded.parent / manifest_name(sharded.name)).unlink()
    (sharded / "meta.pt").write_bytes(b"\x80\x02damaged")
    code, _, err = in_process(capsys, "consolidate", str(sharded), str(tmp_path / "two.ckpt"))
    assert code == 2 and f"{sharded / 'meta.pt'} cannot be read (UnpicklingError: it does not unpickle)" in err, err
    assert "Traceback" not in err and "file an issue" not in err and not (tmp_path / "two.ckpt").exists()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("strategy", "overrides"),
    [
        # flags override the config's init args: ZeRO-2 instead of ZeRO-1, and bf16-mixed precision
        ("data_parallel", ["--trainer.strategy.zero_stage=2", "--trainer.precision=bf16-mixed"]),
        # the registry name in the config, with flags: tensor parallelism and bf16-mixed
        ("model_parallel", ["--trainer.strategy.tensor_parallel_size=2", "--trainer.precision=bf16-mixed"]),
        # the registry name with flags over the config's class path
        ("pipeline_parallel", ["--trainer.strategy=pipeline_parallel", "--trainer.strategy.schedule=1f1b",
                               "--trainer.strategy.n_microbatches=8"]),
    ],
    ids=["data_parallel", "model_parallel", "pipeline_parallel"],
)  # fmt: skip
def test_the_example_config_of_each_strategy_trains_on_2_processes(tmp_path, strategy, overrides):
    done = lightning_scale(
        tmp_path, "fit", f"--config=examples/configs/{strategy}.yaml", *overrides, "--trainer.max_steps=4",
        "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1", "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}", f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
        "--checkpoint.every_n_train_steps=4",
    )  # fmt: skip
    assert done.returncode == 0, output(done)[-4000:]
    assert "`Trainer.fit` stopped: `max_steps=4` reached." in output(done)
    assert "Cost: $" in output(done)
    assert [p.name for p in (tmp_path / "ckpts").glob("*.ckpt")] == ["epoch=0-step=4.ckpt"]


def test_consolidating_a_missing_checkpoint_is_a_usage_error(tmp_path, capsys):
    code, _, err = in_process(capsys, "consolidate", str(tmp_path / "nothing.ckpt"), str(tmp_path / "one.ckpt"))
    assert code == 2 and "cannot consolidate" in err and "nothing.ckpt" in err, err[-2000:]
    assert not (tmp_path / "one.ckpt").exists()
    taken = tmp_path / "taken.ckpt"
    taken.write_bytes(b"a checkpoint")
    code, _, err = in_process(capsys, "consolidate", str(tmp_path / "nothing.ckpt"), str(taken))
    assert code == 2 and "taken.ckpt exists: consolidate never replaces a file" in err, err[-2000:]
    assert taken.read_bytes() == b"a checkpoint"


def test_a_finished_run_leaves_no_process_group_behind(tmp_path):
    """A gloo group still alive at interpreter exit can abort the finished process (exit -6, "terminate called
    without an active exception"), which torchrun counts as a failure; the command tears it down."""
    with mock.patch.dict(os.environ):  # Lightning sets MASTER_ADDR/PORT and the ranks for its group
        main(["fit", *EXAMPLE, "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=ddp",
              "--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--trainer.logger=false", "--cost=null",
              f"--trainer.default_root_dir={tmp_path}", f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
              "--trainer.callbacks+=tests.cli.test_command.SeesTheProcessGroup"])  # fmt: skip
    assert SeesTheProcessGroup.seen == [True]  # it trained in a (one-process) gloo group
    assert not torch.distributed.is_initialized()


class SeesTheProcessGroup(Callback):
    seen: list[bool] = []

    def on_train_start(self, trainer, pl_module) -> None:
        SeesTheProcessGroup.seen.append(torch.distributed.is_initialized())


def test_the_top_level_help_names_consolidate(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "lightning-scale consolidate CHECKPOINT_DIR OUT" in " ".join(capsys.readouterr().out.split())


USER_CODE = ["--model=tests.data.user_code.UserMLP", "--data=tests.data.user_code.UserData",
             '--data.cell={"loader": "torch", "shuffle": "shuffle_true"}', "--cost.price_per_hour=1.5"]  # fmt: skip


@pytest.mark.parametrize(
    ("before", "flags", "expected"),
    [
        ([], ["--trainer.strategy", "data_parallel", "--trainer.strategy.zero_stage", "1"],
         ("DataParallelStrategy", "zero_stage", 1)),
        ([], ["--trainer.strategy=pipeline_parallel", "--trainer.strategy.n_microbatches=4"],
         ("PipelineParallelStrategy", "n_microbatches", 4)),
        ([], ["--trainer.strategy", "model_parallel", "--trainer.strategy.min_params_to_shard", "100"],
         ("ModelParallelStrategy", "min_params_to_shard", 100)),
        (["--config", "examples/configs/model_parallel.yaml"], ["--trainer.strategy.tensor_parallel_size", "2"],
         ("ModelParallelStrategy", "tensor_parallel_size", 2)),
    ],
    ids=["data_parallel", "pipeline_parallel", "model_parallel", "name-in-a-config-file"],
)  # fmt: skip
def test_a_registered_strategy_name_takes_its_arguments_as_flags(capsys, before, flags, expected):
    """The form the README and lightning-scale's own error messages recommend, with a user's module and data."""
    code, out, err = in_process(capsys, "fit", *before, *USER_CODE, *flags, "--print_config")
    assert code == 0, err[-3000:]
    strategy = yaml.safe_load(out)["trainer"]["strategy"]
    name, argument, value = expected
    assert strategy["class_path"] == f"lightning_scale.strategies.{name}"
    assert strategy["init_args"][argument] == value


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_default_run_of_a_users_code_logs_no_warning_the_user_cannot_act_on(tmp_path):
    """Two processes, the default callbacks and logger, a user's StatefulDataLoader with a worker, validation, a
    strategy named with a flag of its own."""
    cell = {"loader": "stateful", "shuffle": "shuffle_true", "workers": 1}
    done = lightning_scale(
        tmp_path, "fit", *USER_CODE, f"--data.cell={json.dumps(cell)}", "--trainer.accelerator=cpu",
        "--trainer.devices=2", "--trainer.strategy=data_parallel", "--trainer.strategy.zero_stage=0",
        "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=2",
        f"--trainer.default_root_dir={tmp_path}", f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
    )  # fmt: skip
    assert done.returncode == 0, output(done)[-4000:]
    assert "`Trainer.fit` stopped: `max_steps=4` reached." in output(done)
    assert "It is recommended to use `self.log(" not in output(done)  # the cost metrics at validation
    assert "set_vital" not in output(done) and "LeafSpec" not in output(done)  # libraries' deprecated calls
    assert "not recommended to provide both args and command line" not in output(done)  # the strategy name rewritten


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_usage_error_at_fit_start_is_one_short_message_and_exit_code_2(tmp_path):
    """Found in setup on both ranks of Lightning's own launcher: rank 0 reports it once, without a traceback."""
    (tmp_path / "a-file").write_text("not a directory")
    done = lightning_scale(
        tmp_path, "fit", *USER_CODE, "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp",
        "--trainer.max_steps=2", f"--trainer.default_root_dir={tmp_path}",
        f"--checkpoint.dirpath={tmp_path / 'a-file'}",
    )  # fmt: skip
    assert done.returncode == USAGE_ERROR_EXIT_CODE, output(done)[-4000:]
    assert "Traceback" not in output(done), output(done)[-4000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("lightning-scale: error:")]
    assert f"Cannot write checkpoints to dirpath={str(tmp_path / 'a-file')!r}" in line and "(dirpath=...)" in line


class RefusedOnRankOne(UserMLP):
    """A module whose check fails on rank 1 only, as a check of something a node has (a path, a device) can."""

    def setup(self, stage: str) -> None:
        if self.trainer.global_rank == 1:
            raise ConfigurationError("rank 1 cannot read /data/shard-1 (mount it, or --data.root ...)")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_usage_error_found_on_rank_1_alone_is_reported_once(tmp_path):
    done = lightning_scale(
        tmp_path, "fit", "--model=tests.cli.test_command.RefusedOnRankOne", *USER_CODE[1:], "--trainer.accelerator=cpu",
        "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.max_steps=2",
        f"--trainer.default_root_dir={tmp_path}", f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
    )  # fmt: skip
    reports = [line for line in done.stderr.splitlines() if line.startswith("lightning-scale: error:")]
    assert reports == ["lightning-scale: error: rank 1 cannot read /data/shard-1 (mount it, or --data.root ...)"], (
        output(done)[-4000:]
    )
    # rank 0's barrier loses its peer: a failure that follows from the usage error, reported by it alone
    assert done.returncode == USAGE_ERROR_EXIT_CODE and "Traceback" not in output(done), output(done)[-4000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_torchrun_restarts_of_a_usage_error_end_at_once_with_the_same_message(tmp_path):
    """torchrun restarts failed workers whatever their exit code; the attempts after the first stop before parsing
    the command further, building the model or joining a process group."""
    fit = [
        "-m", "lightning_scale", "fit", "--model=tests.pipeline.user_layouts.Preprocessed",
        "--data=tests.pipeline.stack_model.StackData", "--trainer.accelerator=cpu", "--trainer.devices=2",
        "--trainer.strategy=pipeline_parallel", "--trainer.max_steps=2", "--cost.price_per_hour=1",
        f"--trainer.default_root_dir={tmp_path}", f"--checkpoint.dirpath={tmp_path / 'ckpts'}",
    ]  # fmt: skip
    command = launch_command(fit, 2, max_restarts=2)
    env = launch_environment([ROOT])
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    text = output(done)
    assert done.returncode == 1, text[-4000:]  # torchrun's own code for a job whose workers failed
    # every worker torchrun saw end, in every attempt, ended with the usage error's code, or with 143 where torchrun's
    # SIGTERM stopped it first (SpotPreemption's exit), which it lists when the worker ends before it looks again
    codes = re.findall(r"failed \(exitcode: (-?\d+)\)", text) + re.findall(r"exitcode\s+: (-?\d+)", text)
    usage = str(USAGE_ERROR_EXIT_CODE)
    assert usage in codes and set(codes) <= {usage, "143"}, text[-4000:]
    # the one traceback is torchrun's own report of the failed job, not a worker's ("<string>": its entry point)
    frames = re.findall(r'File "([^"]+)"', text)
    assert all(f.startswith("<frozen") or f == "<string>" or "/torch/distributed/" in f for f in frames), frames
    reports = [line for line in text.splitlines() if line.startswith("lightning-scale: error:")]
    assert len(reports) == 3, text[-4000:]  # local rank 0 of each attempt, once
    assert "trainable parameters are outside it: pre.weight, pre.bias" in reports[0]
    assert all(r.endswith("(the same usage error stopped this torchrun job's first attempt)") for r in reports[1:])
    assert output(done).count("No valid checkpoint in") == 1  # only the first attempt got as far as setup


def test_under_torchrun_the_job_trains_on_the_nodes_its_rendezvous_formed(monkeypatch):
    """An elastic job (``torchrun --nnodes 1:4``) gets another node count after a node leaves or joins: the command
    takes it from torchrun instead of refusing the ``--trainer.num_nodes`` it was started with."""
    from lightning_scale.cli import ScaleCLI

    monkeypatch.setenv("GROUP_WORLD_SIZE", "3")
    cli = ScaleCLI(
        args=[*USER_CODE, "--trainer.num_nodes=4", "--trainer.accelerator=cpu", "--trainer.logger=false"], run=False
    )
    assert cli.trainer.num_nodes == 3
    monkeypatch.delenv("GROUP_WORLD_SIZE")
    assert (
        ScaleCLI(args=[*USER_CODE, "--trainer.accelerator=cpu", "--trainer.logger=false"], run=False).trainer.num_nodes
        == 1
    )


@pytest.mark.parametrize(("limits", "expected"), [({"max_steps": 5}, "Epoch 13"), ({"max_epochs": 20}, "Epoch 13/19")])
def test_the_progress_bar_reads_the_epoch_without_a_negative_bound(limits, expected):
    """Lightning's Rich bar reads ``Epoch 13/-2`` for a run bounded by steps only (its ``max_epochs`` is -1)."""
    from lightning.pytorch import Trainer

    from lightning_scale.cli.progress_bar import ScaleProgressBar

    bar = ScaleProgressBar()
    trainer = Trainer(callbacks=[bar], logger=False, enable_checkpointing=False, **limits)
    bar.setup(trainer, CharTransformer(), "fit")
    assert bar._get_train_description(13).strip() == expected
