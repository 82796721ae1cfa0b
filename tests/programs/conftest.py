"""Session fixtures of the program tests: one seeded model and two program sets.

Programs are jitted lazily: each shape compiles on its first call and is reused by every test
in the session (and across runs through the persistent compilation cache).
"""

import pytest

from helios_jax.catalog import Catalog

from .helpers import (
    DECODE,
    DECODE_K,
    MODEL,
    MULTISTEP_K,
    ORDINARY_ENGINE,
    PREFILLS,
    RECT,
    SPECULATIVE_ENGINE,
    STATE_OPS,
    WIDTH_ONE,
    WIDTH_ONE_K,
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


@pytest.fixture(scope="session")
def multistep_programs(params):
    """The ordinary engine with single-step and K = 4 step decode."""
    catalog = Catalog(
        "test-multistep",
        "ordinary",
        ORDINARY_ENGINE.speculative_token_capacity,
        ORDINARY_ENGINE.request_slots,
        PREFILLS + (DECODE, DECODE_K) + STATE_OPS,
    )
    return build(ORDINARY_ENGINE.replace(decode_steps=(1, MULTISTEP_K)), catalog, params)


@pytest.fixture(scope="session")
def spec_multistep_programs(params):
    """The adaptive engine with single-step and K = 4 step width-one programs and one wider
    round (to resume drafting after the K steps)."""
    catalog = Catalog(
        "test-spec-multistep",
        "speculative",
        SPECULATIVE_ENGINE.speculative_token_capacity,
        SPECULATIVE_ENGINE.request_slots,
        PREFILLS + (WIDTH_ONE, WIDTH_ONE_K, RECT) + STATE_OPS,
    )
    return build(SPECULATIVE_ENGINE.replace(decode_steps=(1, MULTISTEP_K)), catalog, params)
