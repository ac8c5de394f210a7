"""A dated catalog of cloud instance prices: on-demand and spot USD per hour, each row with its source and date."""

from __future__ import annotations

import csv
import difflib
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path

from lightning_scale.errors import ConfigurationError

__all__ = ["InstancePrice", "PriceCatalog", "PriceCatalogError"]

COLUMNS = (
    "provider",
    "instance_type",
    "region",
    "accelerator",
    "accelerator_count",
    "accelerator_memory_gib",
    "on_demand_usd_per_hour",
    "spot_usd_per_hour",
    "date",
    "source",
)


class PriceCatalogError(ConfigurationError):
    """A price catalog that cannot be read, or a lookup that it cannot answer."""


@dataclass(frozen=True)
class InstancePrice:
    """One instance type's hourly prices (USD, for one node), where they were published and when."""

    provider: str
    instance_type: str
    region: str
    accelerator: str
    accelerator_count: int
    accelerator_memory_gib: float
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    date: str
    source: str

    def usd_per_hour(self, spot: bool) -> float:
        """The hourly price of one node; raises when the catalog has no spot price for it."""
        if not spot:
            return self.on_demand_usd_per_hour
        if self.spot_usd_per_hour is None:
            raise PriceCatalogError(
                f"The catalog has no spot price for {self.provider} {self.instance_type}; pass "
                "price_per_hour=<your spot price> (CostTracker(price_per_hour=...)) or add it to your own catalog CSV."
            )
        return self.spot_usd_per_hour


class PriceCatalog:
    """Instance prices by provider and instance type, read from a CSV with the columns in :data:`COLUMNS`.

    The catalog shipped with lightning-scale (``PriceCatalog.shipped()``) holds list prices of common GPU instances
    on AWS, GCP and Azure in one region each; prices differ by region, change over time and rarely match a
    negotiated contract, so every row says where and when it was published. Pass your own CSV for your prices.

    Examples:
        >>> catalog = PriceCatalog.shipped()
        >>> catalog.lookup("aws", "p4d.24xlarge").accelerator_count
        8
    """

    def __init__(self, rows: Iterable[InstancePrice], origin: str = "<rows>", places: Iterable[str] = ()) -> None:
        """``places`` names where each row came from (``"prices.csv line 12"``), for errors; default ``origin``."""
        self.origin = origin
        self._rows: dict[tuple[str, str], InstancePrice] = {}
        names = iter(places)
        for row in rows:
            self._add(row, next(names, origin))

    def _add(self, row: InstancePrice, where: str) -> None:
        key = (row.provider, row.instance_type.lower())
        if key in self._rows:
            raise PriceCatalogError(f"{where}: {row.provider} {row.instance_type} is listed twice.")
        self._rows[key] = row

    @classmethod
    def shipped(cls) -> PriceCatalog:
        """The catalog that ships with lightning-scale."""
        text = resources.files("lightning_scale.cost").joinpath("prices.csv").read_text(encoding="utf-8")
        return cls.from_text(text, origin="lightning_scale/cost/prices.csv")

    @classmethod
    def from_csv(cls, path: str | Path) -> PriceCatalog:
        """Read a catalog CSV (columns as in :data:`COLUMNS`; ``spot_usd_per_hour`` may be empty)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise PriceCatalogError(f"Cannot read the price catalog {path}: {err}.") from err
        return cls.from_text(text, origin=str(path))

    @classmethod
    def from_text(cls, text: str, origin: str = "<text>") -> PriceCatalog:
        reader = csv.DictReader(io.StringIO(text))
        missing = [column for column in COLUMNS if column not in (reader.fieldnames or [])]
        if missing:
            raise PriceCatalogError(f"{origin}: missing column(s) {missing}; a catalog needs {list(COLUMNS)}.")
        rows, places = [], []
        for row in reader:
            places.append(f"{origin} line {reader.line_num}")
            rows.append(_parse_row(row, places[-1]))
        return cls(rows, origin=origin, places=places)

    @property
    def providers(self) -> list[str]:
        return sorted({provider for provider, _ in self._rows})

    def instance_types(self, provider: str) -> list[str]:
        return sorted(row.instance_type for (p, _), row in self._rows.items() if p == provider)

    def lookup(self, provider: str, instance_type: str) -> InstancePrice:
        """The row for ``instance_type`` of ``provider`` (case-insensitive); the error lists close matches."""
        provider = provider.lower()
        if provider not in self.providers:
            raise PriceCatalogError(
                f"provider={provider!r} is not in the price catalog {self.origin}; known providers: {self.providers}."
            )
        row = self._rows.get((provider, instance_type.lower()))
        if row is not None:
            return row
        known = self.instance_types(provider)
        by_lower = {name.lower(): name for name in known}
        close = [by_lower[name] for name in difflib.get_close_matches(instance_type.lower(), by_lower, n=5, cutoff=0.5)]
        hint = f"close matches: {close}" if close else f"known {provider} instance types: {known}"
        raise PriceCatalogError(
            f"instance_type={instance_type!r} is not in the price catalog {self.origin} for {provider}; {hint}. "
            "Pass price_per_hour=... instead, or catalog_path= a CSV with your prices."
        )


def _parse_row(row: dict[str, str | None], where: str) -> InstancePrice:
    missing = [column for column in COLUMNS if row.get(column) is None]
    if missing:
        raise PriceCatalogError(f"{where}: no value for {missing}; every row has the {len(COLUMNS)} columns.")
    cells = {key: str(value) for key, value in row.items() if key is not None}
    try:
        on_demand = float(cells["on_demand_usd_per_hour"])
        spot = float(cells["spot_usd_per_hour"]) if cells["spot_usd_per_hour"].strip() else None
        count = int(cells["accelerator_count"])
        memory = float(cells["accelerator_memory_gib"])
        date.fromisoformat(cells["date"].strip())
    except (TypeError, ValueError) as err:
        raise PriceCatalogError(f"{where}: {err} (prices and sizes are numbers, date is YYYY-MM-DD).") from err
    if not on_demand >= 0 or (spot is not None and not spot >= 0):  # NaN fails too
        raise PriceCatalogError(f"{where}: negative price for {cells['instance_type']}; prices are USD per hour >= 0.")
    if not cells["source"].strip():
        raise PriceCatalogError(f"{where}: {cells['instance_type']} has no source; every price says where it is from.")
    return InstancePrice(
        provider=cells["provider"].strip().lower(),
        instance_type=cells["instance_type"].strip(),
        region=cells["region"].strip(),
        accelerator=cells["accelerator"].strip(),
        accelerator_count=count,
        accelerator_memory_gib=memory,
        on_demand_usd_per_hour=on_demand,
        spot_usd_per_hour=spot,
        date=cells["date"].strip(),
        source=cells["source"].strip(),
    )
