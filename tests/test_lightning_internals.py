"""The private Lightning hooks wrapped in lightning_scale._lightning_internals still behave as we rely on.

If one of these fails after a Lightning upgrade, exact resume is broken: fix _lightning_internals.py first.
"""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torchdata.stateful_dataloader import StatefulDataLoader

from examples.char_transformer import CharDataModule, CharTransformer
from lightning_scale import _lightning_internals as internals


def test_private_members_we_wrap_exist():
    trainer = Trainer(logger=False, enable_progress_bar=False)
    parameters = list(inspect.signature(trainer._checkpoint_connector.resume_start).parameters)
    assert parameters == ["checkpoint_path", "weights_only"]
    assert callable(type(trainer.fit_loop)._load_combined_loader_states)
    assert hasattr(trainer.fit_loop, "_combined_loader")
    progress = trainer.fit_loop.epoch_loop.batch_progress
    assert hasattr(progress, "is_last_batch") and hasattr(progress.current, "ready")
    assert internals.process_group_timeout(DDPStrategy(timeout=timedelta(seconds=7))) == timedelta(seconds=7)
    assert internals.process_group_timeout(SingleDeviceStrategy("cpu")) == timedelta(minutes=30)  # torch's default
    epoch_loop = trainer.fit_loop.epoch_loop
    assert "_broadcast_sigterm_tensor()" in inspect.getsource(type(epoch_loop).advance)
    undo = internals.skip_sigterm_broadcast(trainer)
    epoch_loop._broadcast_sigterm_tensor()  # no process group needed: it does nothing now
    undo()
    assert epoch_loop._broadcast_sigterm_tensor.__func__ is type(epoch_loop)._broadcast_sigterm_tensor
    # turn_off_slurm_auto_requeue: the signal connector decides from the accelerator connector's environment
    registers = inspect.getsource(type(trainer._signal_connector).register_signal_handlers)
    assert "self.trainer._accelerator_connector.cluster_environment" in registers
    assert "isinstance(environment, SLURMEnvironment) and environment.auto_requeue" in registers


def test_logger_cadence_and_precision_state_key_we_rely_on_exist():
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    trainer = Trainer(logger=False, enable_progress_bar=False)
    assert isinstance(internals.trainer_logs_this_step(trainer), bool)
    assert "prec_plugin.__class__.__qualname__" in inspect.getsource(_CheckpointConnector.dump_checkpoint)


def test_wandb_logger_members_we_reopen_a_run_with_exist(tmp_path):
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="internals")
    assert isinstance(logger._wandb_init, dict) and logger._experiment is None and logger._id is None
    try:
        internals.reopen_wandb_run(logger, "continued1")
        assert logger.version == "continued1" and logger.experiment.id == "continued1"
        assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1  # the fresh run's directory is removed
    finally:
        logger.experiment.finish()


class RecordingLoader(StatefulDataLoader):
    events: list[str] = []

    def __iter__(self):
        RecordingLoader.events.append("iter")
        return super().__iter__()


class RecordingData(CharDataModule):
    def train_dataloader(self):
        loader = super().train_dataloader()
        return RecordingLoader(loader.dataset, batch_size=8, sampler=loader.sampler, drop_last=True)


class InstallHooks(Callback):
    def __init__(self, chosen: str | None) -> None:
        self.chosen, self.choose_calls = chosen, 0

    def setup(self, trainer, pl_module, stage):
        internals.before_train_iterator(trainer, lambda loaders: RecordingLoader.events.append(f"fn:{len(loaders)}"))
        internals.restore_from_when_unset(trainer, self.choose)

    def choose(self):
        self.choose_calls += 1
        return self.chosen


def test_before_train_iterator_runs_before_the_iterator_and_restore_hook_is_used(tmp_path, tiny_trainer_kwargs):
    seed_everything(0)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3)
    Trainer(max_steps=3, callbacks=[saver], **tiny_trainer_kwargs).fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8)
    )
    RecordingLoader.events = []
    hooks = InstallHooks(chosen=saver.best_model_path)
    trainer = Trainer(max_steps=5, callbacks=[hooks], **tiny_trainer_kwargs)
    trainer.fit(CharTransformer(vocab_size=64), datamodule=RecordingData(batch_size=8))
    assert RecordingLoader.events[:2] == ["fn:1", "iter"]
    assert hooks.choose_calls == 1 and trainer.ckpt_path == saver.best_model_path
    assert trainer.global_step == 5  # resumed at step 3 and ran 2 more


def test_explicit_ckpt_path_wins_over_the_restore_hook(tmp_path, tiny_trainer_kwargs):
    seed_everything(0)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2)
    Trainer(max_steps=2, callbacks=[saver], **tiny_trainer_kwargs).fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8)
    )
    hooks = InstallHooks(chosen="/nonexistent.ckpt")
    trainer = Trainer(max_steps=3, callbacks=[hooks], **tiny_trainer_kwargs)
    trainer.fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8), ckpt_path=saver.best_model_path
    )
    assert hooks.choose_calls == 0 and trainer.global_step == 3


def test_lightning_checkpoint_layout_of_loader_state(tmp_path, tiny_trainer_kwargs):
    seed_everything(0)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2)
    Trainer(max_steps=2, callbacks=[saver], **tiny_trainer_kwargs).fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8)
    )
    checkpoint = torch.load(saver.best_model_path, weights_only=True)
    node = checkpoint
    for key in internals.CHECKPOINT_FIT_LOOP_KEYS:
        node = node[key]
    assert "combined_loader" in node
    internals.drop_lightning_loader_state(checkpoint)
    assert "combined_loader" not in node


def test_sharded_checkpoint_flags_we_read_exist():
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    assert internals.writes_sharded_checkpoints(ModelParallelStrategy())
    assert not internals.writes_sharded_checkpoints(ModelParallelStrategy(save_distributed_checkpoint=False))
    assert internals.writes_sharded_checkpoints(FSDPStrategy(state_dict_type="sharded"))
    assert not internals.writes_sharded_checkpoints(FSDPStrategy())


class SeesLoaders(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[object, object, object]] = []

    def setup(self, trainer, pl_module, stage):
        def record(loader):
            self.seen.append((loader, loader._iterator, loader.worker_init_fn))
            return loader

        self.undo = internals.process_dataloaders_with(trainer, record)

    def teardown(self, trainer, pl_module, stage):
        self.undo()


def test_process_dataloaders_with_sees_each_loader_before_its_iterator_after_lightnings_worker_seeding(
    tiny_trainer_kwargs, monkeypatch
):
    from lightning.fabric.utilities.seed import pl_worker_init_function

    monkeypatch.setenv("PL_SEED_WORKERS", "1")  # as seed_everything(workers=True) sets it
    hook = SeesLoaders()
    kwargs = {**tiny_trainer_kwargs, "limit_val_batches": 1, "num_sanity_val_steps": 1, "val_check_interval": 2}
    trainer = Trainer(max_steps=2, callbacks=[hook], **kwargs)
    trainer.fit(CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8))
    assert len(hook.seen) == 2  # the validation loader (for the sanity check), then the training loader
    assert all(iterator is None for _, iterator, _ in hook.seen)
    assert all(getattr(init, "func", None) is pl_worker_init_function for _, _, init in hook.seen)
    assert "process_dataloader" not in vars(trainer.strategy)  # undone


def test_sampler_in_lightning_wrapper_finds_the_users_sampler():
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from torch.utils.data import RandomSampler
    from torch.utils.data.distributed import DistributedSampler

    data = list(range(8))
    inner = RandomSampler(data)
    assert internals.sampler_in_lightning_wrapper(DistributedSamplerWrapper(inner, num_replicas=2, rank=0)) is inner
    assert internals.sampler_in_lightning_wrapper(DistributedSampler(data, num_replicas=2, rank=0)) is None
    assert internals.sampler_in_lightning_wrapper(inner) is None


def test_ddp_sampler_on_one_process_is_the_one_ddp_injects_into_a_training_loader(tiny_trainer_kwargs, monkeypatch):
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from lightning.pytorch.trainer.connectors import data_connector
    from torch.utils.data import DataLoader, IterableDataset, WeightedRandomSampler
    from torch.utils.data.distributed import DistributedSampler

    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    # a training loader's distributed sampler shuffles, whatever the loader was given (Lightning's _process_dataloader)
    assert "is_shuffled = True" in inspect.getsource(data_connector._process_dataloader)
    trainer, data = Trainer(**tiny_trainer_kwargs), list(range(8))
    for shuffle in (True, False):
        sampler = internals.ddp_sampler_on_one_process(trainer, DataLoader(data, batch_size=2, shuffle=shuffle))
        assert type(sampler) is DistributedSampler and sampler.dataset is data
        assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed) == (1, 0, True, 7)
    own = WeightedRandomSampler([1.0] * 8, num_samples=8)
    wrapper = internals.ddp_sampler_on_one_process(trainer, DataLoader(data, sampler=own))
    assert isinstance(wrapper, DistributedSamplerWrapper) and internals.sampler_in_lightning_wrapper(wrapper) is own
    assert (wrapper.num_replicas, wrapper.seed) == (1, 7)
    overfit = Trainer(**{**tiny_trainer_kwargs, "overfit_batches": 2})
    assert not internals.ddp_sampler_on_one_process(overfit, DataLoader(data, shuffle=True)).shuffle
    # where DDP injects none
    given = DataLoader(data, sampler=DistributedSampler(data, num_replicas=1, rank=0))
    stream = DataLoader(type("Stream", (IterableDataset,), {"__iter__": lambda self: iter(data)})())
    for loader in (given, stream, [1, 2]):
        assert internals.ddp_sampler_on_one_process(trainer, loader) is None
    opted_out = Trainer(**{**tiny_trainer_kwargs, "use_distributed_sampler": False})
    assert internals.ddp_sampler_on_one_process(opted_out, DataLoader(data, shuffle=True)) is None


def test_process_dataloaders_with_chains_in_order_and_each_undo_removes_only_its_own(tiny_trainer_kwargs):
    trainer = Trainer(**tiny_trainer_kwargs)
    undo_late = internals.process_dataloaders_with(trainer, lambda loader: [*loader, "late"], order=1)
    undo_early = internals.process_dataloaders_with(trainer, lambda loader: [*loader, "early"])
    assert trainer.strategy.process_dataloader([]) == ["early", "late"]
    undo_early()
    assert trainer.strategy.process_dataloader([]) == ["late"]
    undo_late()
    assert "process_dataloader" not in vars(trainer.strategy)


def private_members_our_subclasses_use() -> dict[str, set[str]]:
    """Per Lightning class: the private names our subclasses of it define or use on ``self`` that its source has."""
    import ast
    import importlib
    import inspect
    import pkgutil
    import re
    import textwrap

    import lightning_scale

    found: dict[str, set[str]] = {}
    for info in pkgutil.walk_packages(lightning_scale.__path__, "lightning_scale."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            bases = [base for base in cls.__mro__[1:] if base.__module__.startswith("lightning.")]
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls))) if bases else None
            names = {
                node.attr if isinstance(node, ast.Attribute) else node.name
                for node in (ast.walk(tree) if tree else [])
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self")
                or isinstance(node, ast.FunctionDef)
            }  # fmt: skip
            for name in (n for n in names if n.startswith("_") and not n.startswith("__")):
                owner = next((b for b in bases if re.search(rf"(self\.|def ){name}\b", inspect.getsource(b))), None)
                if owner is not None:
                    found.setdefault(owner.__qualname__, set()).add(name)
    return found


def test_every_private_member_of_lightning_our_subclasses_rely_on_is_registered_and_still_there():
    """Fails when a subclass starts to use another private member (register it, with its reason) or when an upgrade
    removed one (Lightning's source no longer has it)."""
    from lightning_scale._lightning_internals import INHERITED_PRIVATE

    assert private_members_our_subclasses_use() == {cls: set(names) for cls, names in INHERITED_PRIVATE.items()}


def test_the_batch_count_of_a_checkpoint_moves_and_the_fit_continues_from_it(tmp_path, tiny_trainer_kwargs):
    seed_everything(0)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3)
    Trainer(max_steps=3, callbacks=[saver], **tiny_trainer_kwargs).fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8)
    )
    checkpoint = torch.load(saver.best_model_path, weights_only=True)
    before = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"]
    internals.shift_batches_in_epoch(checkpoint, 2)
    torch.save(checkpoint, tmp_path / "shifted.ckpt")
    seen = []
    trainer = Trainer(max_steps=4, callbacks=[OnBatch(seen)], **tiny_trainer_kwargs)
    trainer.fit(
        CharTransformer(vocab_size=64), datamodule=CharDataModule(batch_size=8), ckpt_path=tmp_path / "shifted.ckpt"
    )
    assert seen == [before + 2]  # the resumed fit counts this epoch's batches from the moved count


class OnBatch(Callback):
    def __init__(self, seen: list[int]) -> None:
        self.seen = seen

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(batch_idx)


class CountingData(CharDataModule):
    calls = 0

    def train_dataloader(self):
        CountingData.calls += 1
        return super().train_dataloader()


class ReloadAfterFirstEpoch(Callback):
    def on_train_start(self, trainer, pl_module):
        internals.reload_train_loaders_after(trainer, epoch=0)


def test_training_loaders_are_built_again_once_after_the_given_epoch(tiny_trainer_kwargs):
    CountingData.calls = 0
    seed_everything(0)
    trainer = Trainer(max_epochs=3, limit_train_batches=2, callbacks=[ReloadAfterFirstEpoch()], **tiny_trainer_kwargs)
    trainer.fit(CharTransformer(vocab_size=64), datamodule=CountingData(batch_size=8))
    assert CountingData.calls == 2  # at the start, and at epoch 1; not again at epoch 2


def test_norm_clipping_routes_through_the_plugin_instance_and_the_undo_restores_lightnings():
    from lightning.pytorch.plugins.precision import Precision

    plugin, param = Precision(), torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([param], lr=1.0)
    routed: list[float] = []
    undo = internals.route_norm_clipping(plugin, lambda opt, clip: routed.append(clip) or opt is optimizer)
    param.grad = torch.full((4,), 3.0)
    plugin.clip_gradients(optimizer, 0.5, "norm")  # Lightning's own entry point calls clip_grad_by_norm
    assert routed == [0.5] and torch.equal(param.grad, torch.full((4,), 3.0))  # ours handled it
    plugin.clip_gradients(torch.optim.SGD([param], lr=1.0), 0.5, "norm")  # another optimizer: Lightning's clipping
    assert float(param.grad.norm()) == pytest.approx(0.5, rel=1e-4)
    undo()
    assert "clip_grad_by_norm" not in vars(plugin)


def test_an_unset_anonymous_is_left_out_of_the_wandb_run_s_arguments_and_a_set_one_kept(tmp_path):
    from lightning.pytorch.loggers import WandbLogger

    unset, chosen = (
        WandbLogger(save_dir=str(tmp_path), offline=True),
        WandbLogger(save_dir=str(tmp_path), anonymous=True),
    )
    assert unset._wandb_init["anonymous"] is None  # what makes W&B warn; Lightning changed if this fails
    internals.drop_unset_wandb_anonymous(unset)
    internals.drop_unset_wandb_anonymous(chosen)
    assert "anonymous" not in unset._wandb_init and chosen._wandb_init["anonymous"] == "allow"


def test_every_save_through_the_trainer_runs_inside_the_routing_and_the_undo_restores_lightnings(
    tmp_path, tiny_trainer_kwargs
):
    import contextlib

    saves: list[int] = []

    @contextlib.contextmanager
    def around():
        saves.append(1)
        yield

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = Trainer(**tiny_trainer_kwargs, max_steps=4, callbacks=[checkpoint])
    undo = internals.route_trainer_saves(trainer, around)
    trainer.fit(CharTransformer(), datamodule=CharDataModule(batch_size=8))
    assert len(saves) == 2 == len(list((tmp_path / "ckpt").glob("*.ckpt")))  # ModelCheckpoint saves through it
    undo()
    assert "save_checkpoint" not in vars(trainer)


def test_lightnings_model_parallel_setup_still_asks_for_configure_model_which_the_stand_in_provides():
    from lightning.pytorch.strategies import ModelParallelStrategy
    from lightning.pytorch.utilities.model_helpers import is_overridden

    assert 'is_overridden("configure_model"' in inspect.getsource(ModelParallelStrategy.setup)
    module = CharTransformer()
    assert not is_overridden("configure_model", module)
    with internals.configure_model_stand_in(module):
        assert is_overridden("configure_model", module)
    assert not is_overridden("configure_model", module) and "configure_model" not in vars(module)


def test_a_resumed_fit_loads_its_checkpoint_through_the_strategys_loader(tmp_path, tiny_trainer_kwargs):
    first = Trainer(**tiny_trainer_kwargs, max_steps=2)
    first.fit(CharTransformer(), datamodule=CharDataModule(batch_size=8))
    first.save_checkpoint(tmp_path / "two.ckpt")
    loaded: list[str] = []

    def load(lightning_load, path, weights_only):
        loaded.append(path)
        return lightning_load(path, weights_only)

    trainer = Trainer(**tiny_trainer_kwargs, max_steps=3)
    internals.load_checkpoints_with(trainer.strategy, load)
    internals.load_checkpoints_with(trainer.strategy, load)  # idempotent
    trainer.fit(CharTransformer(), datamodule=CharDataModule(batch_size=8), ckpt_path=tmp_path / "two.ckpt")
    assert loaded == [str(tmp_path / "two.ckpt")] and trainer.global_step == 3


def test_every_validation_of_a_fit_its_loaders_set_up_and_the_skip_of_one_on_resume_run_inside_the_wrapper(
    tmp_path, tiny_trainer_kwargs
):
    """The skip builds the validation loader's iterator too (Lightning's restart at a validating step), and a resumed
    fit sets the validation loaders up at its start, without a sanity check."""
    import contextlib

    entered: list[str] = []  # what the Trainer was doing, each time the wrapper was entered from outside
    built: list[tuple[str, bool]] = []  # val_dataloader() calls and iterators, and whether the wrapper was open
    depth: list[int] = [0]

    class Seen(torch.utils.data.DataLoader):
        def __iter__(self):
            built.append(("iterator", depth[0] > 0))
            return super().__iter__()

    data = CharDataModule(batch_size=8)

    def val_dataloader():
        built.append(("val_dataloader", depth[0] > 0))
        return Seen(data.train_dataloader().dataset, batch_size=8)

    data.val_dataloader = val_dataloader

    def fit(max_steps: int, ckpt_path: str | None = None) -> Trainer:
        checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
        kwargs = {**tiny_trainer_kwargs, "limit_val_batches": 1}
        trainer = Trainer(**kwargs, max_steps=max_steps, val_check_interval=2, callbacks=[checkpoint])

        @contextlib.contextmanager
        def around():
            if depth[0] == 0:
                entered.append("sanity" if trainer.sanity_checking else "fit")
            depth[0] += 1
            yield
            depth[0] -= 1

        internals.during_fit_validation(trainer, around)
        undo = internals.during_fit_validation(trainer, around)  # again: replaces, does not nest
        trainer.fit(CharTransformer(), datamodule=data, ckpt_path=ckpt_path)
        undo()
        assert not {"run", "increment_progress_to_evaluation_end", "setup_data"} & set(
            vars(trainer.fit_loop.epoch_loop.val_loop)
        )
        return trainer

    fit(2)
    assert entered == ["sanity", "fit"]  # the sanity check sets the loaders up inside itself; step 2's validation
    assert built == [("val_dataloader", True), ("iterator", True), ("iterator", True)]
    entered.clear(), built.clear()
    fit(4, ckpt_path=str(tmp_path / "epoch=0-step=2.ckpt"))  # saved before step 2's validation
    # no sanity check on resume: the loaders' set-up at the fit's start, the skip of step 2's validation, step 4's
    assert entered == ["fit", "fit", "fit"]
    assert built == [("val_dataloader", True), ("iterator", True), ("iterator", True)]
