"""A tiny character-level transformer on Shakespeare's sonnets.

This is the example used by the demo, the tests and the benchmarks: small enough to train for a few steps on a CPU in
seconds, yet it exercises everything exact resume has to get right (model, optimizer, LR scheduler, dataloader position
and RNG state).

* Every batch carries ``sample_id`` (the dataset index of each sample), so tests can check exactly which samples each
  rank saw, and that a resumed run sees the same ones as an uninterrupted run.
* With ``augment=True``, :class:`CharDataset` shifts each window by a random offset drawn from the *global* torch RNG
  inside ``__getitem__`` (in the worker processes when ``num_workers > 0``). This is deliberate: it models random
  augmentation whose RNG state must be checkpointed and restored for a resume to be exact.
* The dataloaders are ``torchdata`` ``StatefulDataLoader``s with seeded samplers and generators, so creating an iterator
  never draws from the global RNG and the loader position can be saved and restored.
"""

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler, StatefulDistributedSampler
from typing_extensions import override

from lightning_scale.data import WorkerRNGDataset

DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "sonnets.txt"


class CharDataset(torch.utils.data.Dataset):
    """Map-style dataset of fixed-length character windows over a text.

    Sample ``i`` is the window starting at ``i * stride`` (plus a random offset in ``[0, jitter)`` when ``augment``);
    ``y`` is ``x`` shifted by one character.

    Args:
        text: The text to model.
        block_size: Number of characters per sample.
        stride: Distance between the starts of consecutive samples; defaults to ``block_size``.
        augment: Shift each window by a random offset drawn from the global torch RNG.
        jitter: Offsets are drawn from ``[0, jitter)``. The length is the same whether or not ``augment`` is set.
        vocab: Character vocabulary to encode with; defaults to the sorted set of characters in ``text``. Pass the
            vocabulary of the full text when several datasets (train/val splits) must share one encoding.
    """

    def __init__(
        self,
        text: str,
        block_size: int = 32,
        stride: int | None = None,
        augment: bool = False,
        jitter: int = 4,
        vocab: list[str] | None = None,
    ) -> None:
        self.block_size = block_size
        self.stride = stride if stride is not None else block_size
        if self.stride < 1 or jitter < 0:
            raise ValueError(f"stride must be >= 1 and jitter >= 0, got stride={self.stride}, jitter={jitter}")
        self.augment = augment
        self.jitter = jitter
        self.vocab: list[str] = sorted(set(text)) if vocab is None else list(vocab)
        self.stoi: dict[str, int] = {ch: i for i, ch in enumerate(self.vocab)}
        self.data = torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)

    def __len__(self) -> int:
        span = self.jitter + self.block_size + 1
        return max(0, (len(self.data) - span) // self.stride + 1)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for dataset of length {len(self)}")
        offset = int(torch.randint(0, self.jitter, (1,)).item()) if self.augment and self.jitter > 0 else 0
        start = i * self.stride + offset
        chunk = self.data[start : start + self.block_size + 1]
        return {"x": chunk[:-1], "y": chunk[1:], "sample_id": torch.tensor(i)}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a GELU MLP, each with a residual connection."""

    def __init__(self, d_model: int, n_heads: int, block_size: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, dropout=0.0, batch_first=True)
        self.attn_drop = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.mlp_drop = nn.Dropout(dropout)
        # True above the diagonal = position may not attend to later positions.
        mask = torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    @override
    def forward(self, x: Tensor) -> Tensor:
        t = x.size(1)
        h = self.ln1(x)
        attn, _ = self.attn(h, h, h, attn_mask=self.causal_mask[:t, :t], need_weights=False)
        x = x + self.attn_drop(attn)
        return x + self.mlp_drop(self.mlp(self.ln2(x)))


class Embed(nn.Module):
    """Token plus learned position embeddings, then dropout: ``(batch, seq)`` ids to ``(batch, seq, d_model)``."""

    def __init__(self, vocab_size: int, block_size: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.tok(x) + self.pos(torch.arange(x.size(1), device=x.device)))


class Head(nn.Module):
    """Final layer norm and the projection to next-character logits."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab_size)

    @override
    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.ln(h))


class CharTransformer(pl.LightningModule):
    """Tiny decoder-only transformer that predicts the next character.

    The whole network is one ``nn.ModuleList``, ``model`` (embedding, blocks, head), applied in order: so
    ``model_parallel`` shards it layer by layer and ``pipeline_parallel`` splits it into
    stages; ``pipeline_loss_fn`` and ``pipeline_split_batch`` are the two methods the pipeline needs.

    Args:
        vocab_size: Number of token ids; must be at least the dataset's vocabulary size.
        block_size: Maximum sequence length (size of the learned position embedding).
        d_model: Width of the residual stream.
        n_heads: Attention heads per block.
        n_layers: Number of transformer blocks.
        dropout: Dropout on the embeddings, attention output and MLP output.
        lr: AdamW learning rate (decayed by 0.9 every 50 steps).
    """

    def __init__(
        self,
        vocab_size: int = 96,
        block_size: int = 32,
        d_model: int = 32,
        n_heads: int = 2,
        n_layers: int = 2,
        dropout: float = 0.1,
        lr: float = 3e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        blocks = [Block(d_model, n_heads, block_size, dropout) for _ in range(n_layers)]
        self.model = nn.ModuleList(
            [Embed(vocab_size, block_size, d_model, dropout), *blocks, Head(d_model, vocab_size)]
        )

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Return next-character logits, shape ``(batch, seq, vocab_size)``, for token ids ``x`` of ``(batch, seq)``."""
        for layer in self.model:
            x = layer(x)
        return x

    def pipeline_loss_fn(self, logits: Tensor, target: Tensor) -> Tensor:
        """Mean next-character cross-entropy of ``logits`` against ``target`` ids."""
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    def pipeline_split_batch(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The model's input and the loss's target in a batch."""
        return batch["x"], batch["y"]

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        inputs, target = self.pipeline_split_batch(batch)
        return self.pipeline_loss_fn(self(inputs), target)

    @override
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    @override
    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("val_loss", loss, sync_dist=True)
        return loss

    @override
    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class CharDataModule(pl.LightningDataModule):
    """Train/val character windows over a text file, served by stateful (resumable) dataloaders.

    Args:
        path: Text file to read; defaults to the shipped ``examples/data/sonnets.txt``.
        block_size: Characters per sample.
        batch_size: Samples per batch (per rank).
        num_workers: Dataloader worker processes.
        augment: Randomly jitter training windows using the global torch RNG (see :class:`CharDataset`).
        seed: Seed of the samplers' and dataloaders' own generators.
        val_fraction: Fraction of the text, taken from its end, used for validation.
        persistent_workers: Keep worker processes alive between epochs (when ``num_workers > 0``).
        worker_rng: Wrap the training set in :class:`~lightning_scale.data.WorkerRNGDataset`, so augmentation drawn
            in worker processes resumes exactly.
        multiprocessing_context: How worker processes start (``"fork"``, ``"forkserver"``, ``"spawn"``; default:
            the platform's). A process that forks while other threads run (gloo, queue feeders, a pin-memory thread)
            can leave a worker deadlocked at start-up on a lock one of them held; ``"forkserver"`` forks from a
            clean process instead.
    """

    def __init__(
        self,
        path: str | None = None,
        block_size: int = 32,
        batch_size: int = 8,
        num_workers: int = 0,
        augment: bool = False,
        seed: int = 0,
        val_fraction: float = 0.1,
        persistent_workers: bool = True,
        worker_rng: bool = True,
        multiprocessing_context: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.path = Path(path) if path is not None else DEFAULT_TEXT
        self.train_set: CharDataset | None = None
        self.val_set: CharDataset | None = None
        self.vocab_size: int | None = None

    @override
    def setup(self, stage: str) -> None:
        text = self.path.read_text(encoding="utf-8")
        vocab = sorted(set(text))  # shared by both splits so they encode alike
        split = int(len(text) * (1 - self.hparams.val_fraction))
        bs = self.hparams.block_size
        self.train_set = CharDataset(text[:split], bs, augment=self.hparams.augment, vocab=vocab)
        self.val_set = CharDataset(text[split:], bs, augment=False, vocab=vocab)
        self.vocab_size = len(vocab)

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.hparams.seed)

    def _context(self) -> str | None:
        return self.hparams.multiprocessing_context if self.hparams.num_workers > 0 else None

    @override
    def train_dataloader(self) -> StatefulDataLoader:
        assert self.train_set is not None, "call setup() first"
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # the strategy says how many data replicas there are and which one this rank reads: ranks that share a
            # model replica (tensor or pipeline parallel) must read the same batches
            replicas = self.trainer.strategy.distributed_sampler_kwargs if self.trainer is not None else {}
            sampler: torch.utils.data.Sampler[int] = StatefulDistributedSampler(
                self.train_set, shuffle=True, seed=self.hparams.seed, drop_last=True, **(replicas or {})
            )
        else:
            sampler = RandomSampler(self.train_set, generator=self._generator())
        dataset = WorkerRNGDataset(self.train_set) if self.hparams.worker_rng else self.train_set
        return StatefulDataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
            drop_last=True,
            persistent_workers=self.hparams.persistent_workers and self.hparams.num_workers > 0,
            generator=self._generator(),
            multiprocessing_context=self._context(),
        )

    @override
    def val_dataloader(self) -> StatefulDataLoader:
        assert self.val_set is not None, "call setup() first"
        return StatefulDataLoader(
            self.val_set,
            batch_size=self.hparams.batch_size,
            shuffle=False,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            generator=self._generator(),
            multiprocessing_context=self._context(),
        )
