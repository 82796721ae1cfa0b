"""The distribution's layout: mapped packages import and the shipped catalogs are present."""
import importlib
import importlib.resources

import pytest


@pytest.mark.parametrize("name", ["helios_jax", "helios_jax.kernels", "helios_jax.reference"])
def test_packages_import(name):
    assert importlib.import_module(name).__doc__


def test_shipped_catalogs_are_package_data():
    names = {p.name for p in importlib.resources.files("helios_jax.catalogs").iterdir()}
    assert {"synthetic-h200.json", "synthetic-h200-ordinary.json"} <= names
