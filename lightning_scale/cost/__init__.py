"""Prices and the cost meter: plain logic, no Lightning imports."""

from lightning_scale.cost.catalog import InstancePrice, PriceCatalog, PriceCatalogError
from lightning_scale.cost.meter import CostMeter, CostReport
from lightning_scale.cost.pricing import Pricing, resolve_pricing
from lightning_scale.cost.rightsizing import RightSizingReport, measure_peak_memory

__all__ = [
    "CostMeter",
    "CostReport",
    "InstancePrice",
    "PriceCatalog",
    "PriceCatalogError",
    "Pricing",
    "RightSizingReport",
    "measure_peak_memory",
    "resolve_pricing",
]
