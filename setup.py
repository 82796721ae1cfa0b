"""Package layout: `kernels/` and `reference/` install as helios_jax.kernels and helios_jax.reference.

The product's top level keeps kernels and oracles beside the library rather than inside it;
`helios_jax/kernels` and `helios_jax/reference` are relative symbolic links to those folders, so
editors, type checkers and `python -m` follow `helios_jax.kernels.*` to the real files, and
setuptools (whose package discovery follows links) packages them like any other subpackage.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["helios_jax", "helios_jax.*"]),
    package_data={"helios_jax": ["catalogs/*.json", "assets/**/*", "conformance/*.md"]},
    include_package_data=True,
)
