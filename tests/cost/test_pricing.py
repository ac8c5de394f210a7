"""Unit tests of resolve_pricing: explicit prices, catalog rows, spot vs on-demand, and the errors naming arguments."""

from __future__ import annotations

import pytest

from lightning_scale.cost.catalog import COLUMNS, PriceCatalog, PriceCatalogError
from lightning_scale.cost.pricing import Pricing, resolve_pricing


def _resolve(
    price_per_hour=None,
    provider=None,
    instance_type=None,
    spot=False,
    catalog_path=None,
    on_demand_price_per_hour=None,
):
    return resolve_pricing(
        price_per_hour=price_per_hour,
        provider=provider,
        instance_type=instance_type,
        spot=spot,
        catalog_path=catalog_path,
        on_demand_price_per_hour=on_demand_price_per_hour,
    )


def test_price_per_hour_alone_is_an_on_demand_price():
    pricing = _resolve(price_per_hour=2.5)
    assert pricing == Pricing(2.5, 2.5, spot=False, source="price_per_hour")


def test_a_spot_price_per_hour_has_no_on_demand_price_unless_given():
    assert _resolve(price_per_hour=1.0, spot=True).node_on_demand_usd_per_hour is None
    pricing = _resolve(price_per_hour=1.0, spot=True, on_demand_price_per_hour=3.0)
    assert (pricing.node_usd_per_hour, pricing.node_on_demand_usd_per_hour, pricing.spot) == (1.0, 3.0, True)


@pytest.mark.parametrize(
    ("kwargs", "baseline"),
    [
        ({"price_per_hour": 1.0}, None),  # on-demand: nothing saved against itself
        ({"provider": "aws", "instance_type": "g5.xlarge"}, None),
        ({"price_per_hour": 1.0, "spot": True}, None),  # unknown
        ({"price_per_hour": 1.0, "spot": True, "on_demand_price_per_hour": 3.0}, 3.0),
        ({"price_per_hour": 1.0, "on_demand_price_per_hour": 3.0}, 3.0),  # a discount that is not spot
        ({"provider": "gcp", "instance_type": "a2-highgpu-8g", "spot": True}, 29.38708),
    ],
)
def test_savings_are_measured_only_against_an_on_demand_price_other_than_the_one_paid(kwargs, baseline):
    assert _resolve(**kwargs).node_savings_baseline_usd_per_hour == baseline


def test_an_explicit_on_demand_price_wins_over_price_per_hour():
    assert _resolve(price_per_hour=1.0, on_demand_price_per_hour=3.0).node_on_demand_usd_per_hour == 3.0


@pytest.mark.parametrize(("provider", "instance_type"), [("aws", "p4d.24xlarge"), ("aws", None), (None, "p5.48xlarge")])
def test_price_per_hour_and_a_catalog_lookup_together_raise(provider, instance_type):
    with pytest.raises(ValueError, match=r"either price_per_hour or provider \+ instance_type"):
        _resolve(price_per_hour=1.0, provider=provider, instance_type=instance_type)


@pytest.mark.parametrize(("provider", "instance_type"), [(None, None), ("aws", None), (None, "p4d.24xlarge")])
def test_no_price_raises_naming_the_arguments(provider, instance_type):
    with pytest.raises(ValueError) as error:
        _resolve(provider=provider, instance_type=instance_type)
    message = str(error.value)
    assert "price_per_hour=" in message and "provider=" in message and "instance_type=" in message


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"price_per_hour": -1.0}, "price_per_hour=-1.0"),
        ({"price_per_hour": float("nan")}, "price_per_hour=nan"),
        ({"price_per_hour": 1.0, "on_demand_price_per_hour": -2.0}, "on_demand_price_per_hour=-2.0"),
        ({"provider": "aws", "instance_type": "p4d.24xlarge", "on_demand_price_per_hour": -2.0}, "on_demand_price"),
    ],
)
def test_a_negative_price_raises_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}.*>= 0"):
        _resolve(**kwargs)


def test_a_catalog_row_on_demand():
    pricing = _resolve(provider="gcp", instance_type="a2-highgpu-8g")
    assert pricing.node_usd_per_hour == pytest.approx(29.38708)
    assert pricing.node_on_demand_usd_per_hour == pytest.approx(29.38708)
    assert not pricing.spot
    assert pricing.row == PriceCatalog.shipped().lookup("gcp", "a2-highgpu-8g")
    assert pricing.source == "catalog lightning_scale/cost/prices.csv"


def test_a_catalog_row_spot_keeps_the_on_demand_price_for_savings():
    pricing = _resolve(provider="gcp", instance_type="A2-HIGHGPU-8G", spot=True)
    assert pricing.node_usd_per_hour == pytest.approx(10.34684)
    assert pricing.node_on_demand_usd_per_hour == pytest.approx(29.38708)
    assert pricing.spot


def test_an_explicit_on_demand_price_wins_over_the_catalog():
    pricing = _resolve(provider="gcp", instance_type="a2-highgpu-8g", spot=True, on_demand_price_per_hour=20.0)
    assert pricing.node_on_demand_usd_per_hour == 20.0


def test_spot_from_a_catalog_row_without_a_spot_price_raises_naming_price_per_hour():
    with pytest.raises(PriceCatalogError, match=r"no spot price.*price_per_hour"):
        _resolve(provider="aws", instance_type="p5.4xlarge", spot=True)


def test_a_catalog_row_spot_price_for_the_usual_aws_gpu_instance():
    pricing = _resolve(provider="aws", instance_type="g5.xlarge", spot=True)
    assert (pricing.node_usd_per_hour, pricing.node_on_demand_usd_per_hour) == (0.436, 1.006)


def test_an_unknown_instance_type_raises_a_value_error():
    with pytest.raises(ValueError, match=r"close matches.*'p5\.48xlarge'"):
        _resolve(provider="aws", instance_type="p5.48xlarg")


def test_a_user_catalog_replaces_the_shipped_one(tmp_path):
    path = tmp_path / "contract.csv"
    path.write_text(
        ",".join(COLUMNS) + "\naws,p4d.24xlarge,us-west-2,A100-40GB,8,40,12.0,5.0,2026-02-01,https://intranet/prices\n",
        encoding="utf-8",
    )
    pricing = _resolve(provider="aws", instance_type="p4d.24xlarge", spot=True, catalog_path=str(path))
    assert (pricing.node_usd_per_hour, pricing.node_on_demand_usd_per_hour) == (5.0, 12.0)
    assert pricing.source == f"catalog {path}"
    with pytest.raises(PriceCatalogError, match=r"known aws instance types: \['p4d.24xlarge'\]"):
        _resolve(provider="aws", instance_type="zzzzzzzz", catalog_path=str(path))


def test_a_missing_user_catalog_raises(tmp_path):
    with pytest.raises(PriceCatalogError, match="Cannot read the price catalog"):
        _resolve(provider="aws", instance_type="p4d.24xlarge", catalog_path=str(tmp_path / "missing.csv"))


def test_describe_multiplies_by_nodes_and_cites_the_catalog_row():
    fields = _resolve(provider="aws", instance_type="p5en.48xlarge", spot=True).describe(num_nodes=4)
    assert fields["cost/num_nodes"] == 4
    assert fields["cost/node_usd_per_hour"] == pytest.approx(27.1988)
    assert fields["cost/usd_per_hour"] == pytest.approx(4 * 27.1988)
    assert fields["cost/on_demand_usd_per_hour"] == pytest.approx(4 * 63.296)
    assert fields["cost/spot"] is True
    assert fields["cost/provider"] == "aws"
    assert fields["cost/instance_type"] == "p5en.48xlarge"
    assert fields["cost/region"] == "us-east-1"
    assert fields["cost/accelerator"] == "8x H200-141GB"
    assert fields["cost/price_date"] == "2026-08-06"
    assert fields["cost/price_url"] == "https://github.com/dstackai/dstack/pull/4110"


def test_describe_of_an_explicit_price_has_no_catalog_fields():
    fields = _resolve(price_per_hour=1.5, spot=True).describe(num_nodes=2)
    assert fields == {
        "cost/num_nodes": 2,
        "cost/node_usd_per_hour": 1.5,
        "cost/usd_per_hour": 3.0,
        "cost/on_demand_usd_per_hour": None,
        "cost/spot": True,
        "cost/price_source": "price_per_hour",
    }
