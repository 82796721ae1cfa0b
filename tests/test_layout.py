"""The distribution's layout: the linked packages import from the top-level folders and the shipped
catalogs are present."""

import importlib
import importlib.resources
import pathlib

import pytest


@pytest.mark.parametrize("name", ["helios_jax", "helios_jax.kernels", "helios_jax.reference"])
def test_packages_import(name):
    assert importlib.import_module(name).__doc__


def test_shipped_catalogs_are_package_data():
    names = {p.name for p in importlib.resources.files("helios_jax.catalogs").iterdir()}
    assert {"synthetic-h200.json", "synthetic-h200-ordinary.json"} <= names


@pytest.mark.parametrize("name", ["kernels", "reference"])
def test_linked_packages_are_the_top_level_folders(name):
    """helios_jax/kernels and helios_jax/reference are links to kernels/ and reference/ (one copy of
    each file, followed by editors and setuptools alike)."""
    module = importlib.import_module(f"helios_jax.{name}")
    package_dir = pathlib.Path(module.__file__).parent
    root = pathlib.Path(importlib.import_module("helios_jax").__file__).parent.parent
    assert package_dir.resolve() == (root / name).resolve()
