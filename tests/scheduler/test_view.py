"""The selector's plain data (view.py): the logical prompt work a chunk may take."""

import pytest

from helios_jax.scheduler.view import Phase, RequestView

spec = pytest.mark.spec


def view(**kw):
    return RequestView(rid=0, slot=0, phase=Phase.PREFILL, **kw)


@spec("useful-service/prefill-logical-limits", "prerequisites/atomic-span-chunk")
def test_prompt_work_stops_at_limits_and_never_cuts_an_image_span():
    assert view(prompt_remaining=100).prompt_work(64) == 64
    assert view(prompt_remaining=40).prompt_work(64) == 40
    assert view(prompt_remaining=100, prompt_limit=30).prompt_work(64) == 30
    assert view(prompt_remaining=100, prompt_limit=0).prompt_work(64) == 0
    spans = ((10, 50), (60, 70))
    assert view(prompt_remaining=100, atomic_spans=spans).prompt_work(80) == 80  # after both spans
    # A cut inside a span moves back to the span's start; a cut at a span's end is fine.
    assert view(prompt_remaining=100, atomic_spans=spans).prompt_work(32) == 10
    assert view(prompt_remaining=100, atomic_spans=spans).prompt_work(50) == 50
    assert view(prompt_remaining=100, atomic_spans=spans).prompt_work(10) == 10  # ... and at its start
    assert view(prompt_remaining=100, atomic_spans=spans).prompt_work(65) == 60
    # A span from the cursor that the chunk cannot hold whole: no work at all this time.
    assert view(prompt_remaining=500, atomic_spans=((0, 300),)).prompt_work(256) == 0
