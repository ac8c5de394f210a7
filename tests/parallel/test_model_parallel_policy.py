"""The automatic FSDP2 units and the default tensor-parallel plan, on plain modules (no processes)."""

from __future__ import annotations

import pytest
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from examples.char_transformer import CharTransformer
from lightning_scale.parallel.model import ShardingPolicyError, default_tensor_parallel_plan, sharding_units
from lightning_scale.strategies import ModelParallelStrategy


def test_each_block_of_a_module_list_is_a_unit_and_its_mlp_is_split_column_then_row():
    model = CharTransformer(n_layers=3)
    units = sharding_units(model, min_params=10**9)  # a ModuleList wins over the size rule
    assert [name for name, _ in units] == [f"model.{i}" for i in range(5)]  # embedding, 3 blocks, head
    plan = default_tensor_parallel_plan(model, units)
    assert sorted(plan) == [f"model.{i}.mlp.{j}" for i in (1, 2, 3) for j in (0, 2)]
    assert isinstance(plan["model.2.mlp.0"], ColwiseParallel) and isinstance(plan["model.2.mlp.2"], RowwiseParallel)


def test_without_a_module_list_large_children_are_units_and_a_norm_between_linears_is_not_an_mlp():
    model = nn.Sequential(nn.Linear(64, 64), nn.Sequential(nn.Linear(64, 8), nn.LayerNorm(8), nn.Linear(8, 64)))
    assert [name for name, _ in sharding_units(model, min_params=1000)] == ["0", "1"]
    assert default_tensor_parallel_plan(model, [("1", model[1])]) == {}


def test_a_model_with_nothing_to_shard_is_refused_with_the_fix():
    with pytest.raises(ShardingPolicyError, match=r"min_params_to_shard=1000.*largest has 12.*configure_model"):
        sharding_units(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)), min_params=1000)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"tensor_parallel_size": 0}, r"tensor_parallel_size=0 must be >= 1"), ({"min_params_to_shard": 0}, r">= 1")],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelParallelStrategy(**kwargs)


def test_attention_with_separate_projections_is_split_by_heads():
    from tests.parallel.models import LinearAttentionModel

    model = LinearAttentionModel(n_layers=2)
    plan = default_tensor_parallel_plan(model, sharding_units(model, min_params=1))
    for role, style in (("q_proj", ColwiseParallel), ("k_proj", ColwiseParallel), ("v_proj", ColwiseParallel),
                        ("o_proj", RowwiseParallel)):  # fmt: skip
        assert isinstance(plan[f"model.2.attn.{role}"], style)
    assert len(plan) == 2 * (4 + 2)  # attention and MLP of each block


def test_a_three_layer_mlp_alternates_column_and_row_and_nested_blocks_are_sharded_innermost_first(monkeypatch):
    import lightning_scale.parallel.model.policy as policy

    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 8))
    plan = default_tensor_parallel_plan(mlp, [("mlp", mlp)])
    assert sorted(plan) == ["mlp.0", "mlp.2"]  # the Linear closing a pair does not open the next
    nested = nn.Module()
    nested.blocks = nn.ModuleList([nn.ModuleList([nn.Linear(2, 2)]) for _ in range(2)])
    units = sharding_units(nested, min_params=1)
    assert [name for name, _ in units] == ["blocks.0", "blocks.1", "blocks.0.0", "blocks.1.0"]
    order: list[nn.Module] = []
    monkeypatch.setattr(policy, "fully_shard", lambda module, mesh: order.append(module))  # records the order only
    policy.apply_fsdp(nested, units, dp_mesh=None)
    assert order == [nested.blocks[0][0], nested.blocks[1][0], nested.blocks[0], nested.blocks[1], nested]
