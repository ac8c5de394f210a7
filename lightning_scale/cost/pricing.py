"""What one node costs per hour: an explicit price or a catalog row, resolved and validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_scale.cost.catalog import InstancePrice, PriceCatalog
from lightning_scale.errors import ConfigurationError

__all__ = ["Pricing", "resolve_pricing"]


@dataclass(frozen=True)
class Pricing:
    """The pricing assumptions of a run: the hourly price of one node, and where it comes from."""

    node_usd_per_hour: float
    node_on_demand_usd_per_hour: float | None
    spot: bool
    source: str
    row: InstancePrice | None = None

    @property
    def node_savings_baseline_usd_per_hour(self) -> float | None:
        """The on-demand price that savings are measured against: ``None`` when it is unknown or is the price paid
        (savings against the same price would only be minus the preemption waste, which is logged on its own)."""
        on_demand = self.node_on_demand_usd_per_hour
        return None if on_demand is None or on_demand == self.node_usd_per_hour else on_demand

    def describe(self, num_nodes: int) -> dict[str, object]:
        """Flat ``cost/...`` fields for a tracker's run config."""
        fields: dict[str, object] = {
            "cost/num_nodes": num_nodes,
            "cost/node_usd_per_hour": self.node_usd_per_hour,
            "cost/usd_per_hour": self.node_usd_per_hour * num_nodes,
            "cost/on_demand_usd_per_hour": (
                None if self.node_on_demand_usd_per_hour is None else self.node_on_demand_usd_per_hour * num_nodes
            ),
            "cost/spot": self.spot,
            "cost/price_source": self.source,
        }
        if self.row is not None:
            fields.update(
                {
                    "cost/provider": self.row.provider,
                    "cost/instance_type": self.row.instance_type,
                    "cost/region": self.row.region,
                    "cost/accelerator": f"{self.row.accelerator_count}x {self.row.accelerator}",
                    "cost/price_date": self.row.date,
                    "cost/price_url": self.row.source,
                }
            )
        return fields


def resolve_pricing(
    price_per_hour: float | None,
    provider: str | None,
    instance_type: str | None,
    spot: bool,
    catalog_path: str | None,
    on_demand_price_per_hour: float | None,
) -> Pricing:
    """Validate the pricing arguments of :class:`~lightning_scale.callbacks.CostTracker` and resolve one node's price.

    Raises ``ValueError`` naming the argument to change.
    """
    for name, value in (("price_per_hour", price_per_hour), ("on_demand_price_per_hour", on_demand_price_per_hour)):
        if value is not None and not value >= 0:
            raise ConfigurationError(
                f"{name}={value} must be >= 0 USD per hour for one node (CostTracker({name}=...))."
            )
    if price_per_hour is not None:
        if provider is not None or instance_type is not None:
            raise ConfigurationError(
                "Pass either price_per_hour or provider + instance_type (a catalog lookup), not both "
                f"(got price_per_hour={price_per_hour}, provider={provider!r}, instance_type={instance_type!r})."
            )
        on_demand = on_demand_price_per_hour
        if on_demand is None and not spot:
            on_demand = price_per_hour  # an on-demand price given as price_per_hour
        return Pricing(price_per_hour, on_demand, spot, source="price_per_hour")
    if provider is None or instance_type is None:
        raise ConfigurationError(
            "CostTracker needs a price: price_per_hour=<USD per node-hour>, or provider= ('aws', 'gcp', 'azure') and "
            f"instance_type= for the shipped catalog (got provider={provider!r}, instance_type={instance_type!r})."
        )
    catalog = PriceCatalog.from_csv(catalog_path) if catalog_path else PriceCatalog.shipped()
    row = catalog.lookup(provider, instance_type)
    on_demand = row.on_demand_usd_per_hour if on_demand_price_per_hour is None else on_demand_price_per_hour
    return Pricing(row.usd_per_hour(spot), on_demand, spot, source=f"catalog {catalog.origin}", row=row)
