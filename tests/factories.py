"""Importable model and data factories for tests that train in fresh processes."""

from __future__ import annotations

from examples.char_transformer import CharDataModule, CharTransformer


def model() -> CharTransformer:
    return CharTransformer(vocab_size=64, dropout=0.1)


def data_workers0() -> CharDataModule:
    return CharDataModule(batch_size=8, num_workers=0, augment=True)


def data_workers2() -> CharDataModule:
    return CharDataModule(batch_size=8, num_workers=2, augment=True)


def data_workers2_no_worker_rng() -> CharDataModule:
    return CharDataModule(batch_size=8, num_workers=2, augment=True, worker_rng=False)
