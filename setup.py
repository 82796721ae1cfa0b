"""Package layout: `kernels/` and `reference/` install as helios_jax.kernels and helios_jax.reference.

The product's top level keeps kernels and oracles beside the library rather than inside it;
`helios_jax/kernels` and `helios_jax/reference` are relative symbolic links to those folders, so
editors, type checkers and `python -m` follow `helios_jax.kernels.*` to the real files, and
setuptools (whose package discovery follows links) packages them like any other subpackage.
Data folders without an `__init__.py` (the embedded model under `helios_jax/assets`) are listed
as namespace packages, as setuptools asks of every importable folder whose files it ships.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["helios_jax", "helios_jax.*"], exclude=["*.__pycache__"]),
    package_data={"helios_jax": ["catalogs/*.json", "assets/**/*", "conformance/*.md"]},
    include_package_data=True,
)
