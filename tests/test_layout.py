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


# Module and function size limits of docs/design.md ("Module and function size"), counted on the
# formatted source; the exceptions are listed there with their reasons.
MODULE_LINES, FUNCTION_LINES = 500, 60
EXCEPTIONS: dict[str, str] = {}


def _sources():
    """Every module of the package, the linked kernels/ and reference/ included."""
    import os

    root = pathlib.Path(importlib.import_module("helios_jax").__file__).parent
    for folder, _, files in sorted(os.walk(root, followlinks=True)):
        for file in sorted(f for f in files if f.endswith(".py")):
            path = pathlib.Path(folder) / file
            yield path.relative_to(root.parent).as_posix(), path.read_text()


def test_no_module_or_function_is_over_the_size_limits():
    import ast

    over = []
    for name, source in _sources():
        if len(source.splitlines()) > MODULE_LINES and name not in EXCEPTIONS:
            over.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES and f"{name}:{node.name}" not in EXCEPTIONS:
                    over.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert not over, "over the size limits (docs/design.md):\n" + "\n".join(over)
