"""The spec's HTTP scheduler scenarios (``scheduler_http.py``) under adaptive speculative execution."""

import pytest

from .scheduler_http import (  # noqa: F401 (collected here, on this module's server)
    serve,
    test_cancellation_then_slot_reuse,
    test_concurrent_long_prompts,
    test_decode_streams,
    test_greedy_output_over_http_equals_offline_greedy_decoding,
    test_long_prompt_during_decode_and_short_long_contention,
)
from .structured_http import (  # noqa: F401 (structured output on this module's server)
    test_forced_tool_choices_return_calls_that_fit_the_tools,
    test_greedy_constrained_output_equals_the_masked_reference,
    test_multi_token_bad_words_equal_the_masked_reference,
    test_sampled_choices_and_regexes_hold,
    test_sampled_json_outputs_are_valid_for_their_schema,
)


@pytest.fixture(scope="module")
def server():
    yield from serve("adaptive")
