"""The spec's HTTP scheduler scenarios (``scheduler_http.py``) under ordinary execution."""

import pytest

from .scheduler_http import (  # noqa: F401 (collected here, on this module's server)
    serve,
    test_cancellation_then_slot_reuse,
    test_concurrent_long_prompts,
    test_decode_streams,
    test_greedy_output_over_http_equals_offline_greedy_decoding,
    test_long_prompt_during_decode_and_short_long_contention,
)

# Structured output runs on the fixed and adaptive servers (each against the numpy reference);
# the token mask in the ordinary decode programs is checked by tests/programs/test_token_mask.py.


@pytest.fixture(scope="module")
def server():
    yield from serve("off")
