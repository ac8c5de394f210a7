"""Unit tests of the price catalog: the shipped CSV's rows, lookups and their errors, and user CSVs that are wrong."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from lightning_scale.cost.catalog import COLUMNS, PriceCatalog, PriceCatalogError

HEADER = ",".join(COLUMNS)
GOOD_ROW = "aws,x1.big,us-east-1,H100,8,80,10.0,4.0,2026-01-02,https://example.com/prices"


def _write_csv(tmp_path, *rows, header=HEADER):
    path = tmp_path / "my_prices.csv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def shipped():
    return PriceCatalog.shipped()


def _rows(catalog):
    return [catalog.lookup(p, name) for p in catalog.providers for name in catalog.instance_types(p)]


def test_the_shipped_catalog_loads_every_row_of_the_csv(shipped):
    text = resources.files("lightning_scale.cost").joinpath("prices.csv").read_text(encoding="utf-8")
    data_lines = [line for line in text.splitlines()[1:] if line.strip()]
    assert len(_rows(shipped)) == len(data_lines) > 0


def test_every_shipped_row_is_dated_sourced_and_priced_sensibly(shipped):
    for row in _rows(shipped):
        assert row.provider in {"aws", "gcp", "azure"}, row
        assert re.fullmatch(r"https?://\S+", row.source), row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row.date), row
        assert row.on_demand_usd_per_hour >= 0, row
        if row.spot_usd_per_hour is not None:
            assert 0 <= row.spot_usd_per_hour <= row.on_demand_usd_per_hour, row
        assert row.accelerator_count > 0 and row.accelerator_memory_gib > 0, row


def test_each_provider_has_several_gpu_rows(shipped):
    assert shipped.providers == ["aws", "azure", "gcp"]
    for provider in shipped.providers:
        gpus = [row for row in _rows(shipped) if row.provider == provider and row.accelerator_count > 0]
        assert len(gpus) >= 5, provider


def test_a_known_row_has_its_published_numbers(shipped):
    row = shipped.lookup("aws", "p4d.24xlarge")
    assert (row.accelerator, row.accelerator_count, row.accelerator_memory_gib) == ("A100-40GB", 8, 40.0)
    assert row.on_demand_usd_per_hour == pytest.approx(21.957642)
    assert row.spot_usd_per_hour == pytest.approx(8.0001)  # the median of 4 us-east-1 zones in the snapshot


def test_instance_type_lookup_ignores_case(shipped):
    assert shipped.lookup("aws", "P4D.24XLARGE") is shipped.lookup("aws", "p4d.24xlarge")
    assert shipped.lookup("azure", "standard_nc6s_v3").instance_type == "Standard_NC6s_v3"


def test_provider_lookup_ignores_case(shipped):
    assert shipped.lookup("AWS", "p4d.24xlarge") is shipped.lookup("aws", "p4d.24xlarge")


def test_an_unknown_instance_type_lists_close_matches_and_the_price_per_hour_escape(shipped):
    with pytest.raises(PriceCatalogError) as error:
        shipped.lookup("aws", "p4d.24xlarg")
    message = str(error.value)
    assert "'p4d.24xlarg'" in message
    assert "close matches" in message and "'p4d.24xlarge'" in message
    assert "price_per_hour" in message


def test_an_instance_type_with_no_close_match_lists_the_provider_instance_types(shipped):
    with pytest.raises(PriceCatalogError, match="known gcp instance types") as error:
        shipped.lookup("gcp", "zzzzzzzz")
    assert "'a2-highgpu-8g'" in str(error.value)


def test_an_unknown_provider_lists_the_known_providers(shipped):
    with pytest.raises(PriceCatalogError, match=r"provider='oracle'.*\['aws', 'azure', 'gcp'\]"):
        shipped.lookup("oracle", "p4d.24xlarge")


def test_spot_price_of_a_row_without_one_raises_naming_price_per_hour(shipped):
    row = shipped.lookup("aws", "p5.4xlarge")
    assert row.usd_per_hour(spot=False) == row.on_demand_usd_per_hour
    with pytest.raises(PriceCatalogError, match=r"no spot price for aws p5\.4xlarge.*price_per_hour"):
        row.usd_per_hour(spot=True)


def test_the_rows_without_a_spot_price_are_the_ones_the_docs_name(shipped):
    without = {(row.provider, row.instance_type) for row in _rows(shipped) if row.spot_usd_per_hour is None}
    assert without == {("aws", "p5.4xlarge"), ("gcp", "n1-standard-4"), ("azure", "Standard_NC40ads_H100_v5"),
                       ("azure", "Standard_ND96isr_H100_v5")}  # fmt: skip
    page = Path(__file__).resolve().parents[2] / "docs" / "callbacks" / "cost-tracker.md"
    text = " ".join(page.read_text().split())
    assert "Rows without a spot price: " + ", ".join(f"{p} `{name}`" for p, name in sorted(without)) in text


def test_spot_price_of_a_row_with_one(shipped):
    row = shipped.lookup("aws", "p5en.48xlarge")
    assert row.usd_per_hour(spot=True) == pytest.approx(27.1988)
    assert row.usd_per_hour(spot=False) == pytest.approx(63.296)


def test_a_user_csv_is_read_with_empty_spot_and_normalised_fields(tmp_path):
    path = _write_csv(tmp_path, GOOD_ROW, " AWS , x2.small ,us-east-1,L4,1,24,0.5,,2026-01-02, https://example.com ")
    catalog = PriceCatalog.from_csv(path)
    assert catalog.origin == str(path)
    assert catalog.instance_types("aws") == ["x1.big", "x2.small"]
    small = catalog.lookup("aws", "x2.small")
    assert (small.provider, small.on_demand_usd_per_hour, small.spot_usd_per_hour) == ("aws", 0.5, None)
    assert small.source == "https://example.com"
    assert catalog.lookup("aws", "x1.big").usd_per_hour(spot=True) == 4.0


def test_a_user_csv_with_missing_columns_names_the_file_and_the_columns(tmp_path):
    path = _write_csv(tmp_path, header=HEADER.replace(",source", ""))
    with pytest.raises(PriceCatalogError) as error:
        PriceCatalog.from_csv(path)
    assert str(path) in str(error.value) and "['source']" in str(error.value)


@pytest.mark.parametrize(
    ("bad_row", "expected"),
    [
        (GOOD_ROW.replace(",10.0,", ",-10.0,"), "negative price"),
        (GOOD_ROW.replace(",4.0,", ",-4.0,"), "negative price"),
        (GOOD_ROW.replace("2026-01-02", "2026-13-40"), "YYYY-MM-DD"),
        (GOOD_ROW.replace("2026-01-02", "last week"), "YYYY-MM-DD"),
        (GOOD_ROW.replace(",10.0,", ",ten,"), "numbers"),
        (GOOD_ROW.replace("https://example.com/prices", "  "), "no source"),
    ],
)
def test_a_bad_row_names_the_file_and_its_line(tmp_path, bad_row, expected):
    path = _write_csv(tmp_path, GOOD_ROW.replace("x1.big", "x0.first"), bad_row)
    with pytest.raises(PriceCatalogError, match=re.escape(expected)) as error:
        PriceCatalog.from_csv(path)
    assert f"{path} line 3" in str(error.value)


def test_a_duplicate_row_names_the_file_and_its_line(tmp_path):
    path = _write_csv(tmp_path, GOOD_ROW, GOOD_ROW.replace("x1.big", "X1.BIG"))
    with pytest.raises(PriceCatalogError, match="listed twice") as error:
        PriceCatalog.from_csv(path)
    assert f"{path} line 3" in str(error.value)


def test_a_truncated_row_names_the_file_and_its_line(tmp_path):
    path = _write_csv(tmp_path, GOOD_ROW.rsplit(",", 1)[0])  # no source field at all
    with pytest.raises(PriceCatalogError) as error:
        PriceCatalog.from_csv(path)
    assert f"{path} line 2" in str(error.value)


def test_a_nan_price_is_rejected(tmp_path):
    path = _write_csv(tmp_path, GOOD_ROW.replace(",10.0,", ",nan,"))
    with pytest.raises(PriceCatalogError, match="line 2"):
        PriceCatalog.from_csv(path)


def test_a_missing_file_gives_a_clear_error(tmp_path):
    path = tmp_path / "nowhere.csv"
    with pytest.raises(PriceCatalogError, match=rf"Cannot read the price catalog {re.escape(str(path))}"):
        PriceCatalog.from_csv(path)
