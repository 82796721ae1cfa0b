"""Session fixtures of the program tests: one seeded model and two program sets.

Programs are jitted lazily: each shape compiles on its first call and is reused by every test
in the session (and across runs through the persistent compilation cache).
"""

import pytest

from .helpers import (
    MODEL,
    ORDINARY_ENGINE,
    SPECULATIVE_ENGINE,
    build,
    ordinary_catalog,
    random_params,
    speculative_catalog,
)


@pytest.fixture(scope="session")
def params():
    return random_params(MODEL, seed=0)


@pytest.fixture(scope="session")
def spec_programs(params):
    return build(SPECULATIVE_ENGINE, speculative_catalog(), params)


@pytest.fixture(scope="session")
def ordinary_programs(params):
    return build(ORDINARY_ENGINE, ordinary_catalog(), params)
