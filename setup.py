"""Package layout: `kernels/` and `reference/` install as helios_jax.kernels and helios_jax.reference.

The product's top level keeps kernels and oracles beside the library rather than inside it, so
the mapping is computed here instead of listed by hand in pyproject.toml.
"""
from setuptools import find_packages, setup

_MAPPED = {"helios_jax.kernels": "kernels", "helios_jax.reference": "reference"}


def _packages():
    packages = find_packages(include=["helios_jax", "helios_jax.*"])
    package_dir = {"helios_jax": "helios_jax"}
    for name, folder in _MAPPED.items():
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(where=folder):
            packages.append(f"{name}.{sub}")
            package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return packages, package_dir


_packages_list, _package_dir = _packages()

setup(
    packages=_packages_list,
    package_dir=_package_dir,
    package_data={"helios_jax": ["catalogs/*.json", "assets/**/*", "conformance/*.md"]},
    include_package_data=True,
)
