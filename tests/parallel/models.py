"""Variants of the example transformer for model_parallel tests: attention built from separate q/k/v/o Linear layers
(as torchtitan's models are), and a module that shards itself in configure_model."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.fsdp import fully_shard

from tests.parallel.job import Model


class LinearAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # heads from the width: a share of them per rank
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = LinearAttention(d_model, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LinearAttentionModel(Model):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        d_model, n_heads = self.hparams.d_model, self.hparams.n_heads
        for i in range(self.hparams.n_layers):  # the example's blocks sit between its embedding and its head
            self.model[1 + i] = Block(d_model, n_heads)


class UserShardedModel(Model):
    """Shards itself as one FSDP2 unit in configure_model: the strategy must apply nothing of its own."""

    def configure_model(self) -> None:
        fully_shard(self, mesh=self.device_mesh["data_parallel"])
        print(f"user configure_model ran on rank {self.global_rank}")
