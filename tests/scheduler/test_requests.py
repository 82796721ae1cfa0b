"""Per-request host state and the resource pools (requests.py)."""

import pytest

from helios_jax.scheduler.plan import Handle
from helios_jax.scheduler.requests import Pool, Request, ResourceError, pages_for

spec = pytest.mark.spec


def request(prompt_len=1000, consumed=0, message_endpoints=(), image_spans=()):
    return Request(
        handle=Handle(3, 0),
        slot=3,
        prompt=tuple(range(prompt_len)),
        max_output=8,
        stop_token_ids=frozenset(),
        message_endpoints=tuple(message_endpoints),
        image_spans=tuple(image_spans),
        needs_scores=False,
        host_stops=False,
        sampling=None,
        proposal_source="learned",
        pages=[],
        admitted_ns=0,
        history=None,
        acceptance=None,
        forecast=None,
        consumed=consumed,
    )


def test_pools_hand_out_the_lowest_free_ids_and_take_back_only_their_owners():
    pool = Pool(4, "slots")
    assert pool.available == 4 and pool.can_allocate(4) and not pool.can_allocate(5)
    assert pool.allocate(2, owner=7) == [0, 1]
    assert pool.allocate(1, owner=8) == [2]
    assert pool.owned() == {0: 7, 1: 7, 2: 8} and pool.available == 1
    with pytest.raises(ResourceError, match="slots: 2 requested, 1 free"):
        pool.allocate(2, owner=9)
    with pytest.raises(ResourceError):
        pool.free([2], owner=7)  # not its slot
    pool.free([1, 0], owner=7)
    assert pool.owned() == {2: 8} and pool.allocate(3, owner=9) == [0, 1, 3]


@spec("planning-queue/exact-endpoints")
def test_the_next_endpoint_is_counted_from_the_cursor_and_strictly_ahead_of_it():
    chat = request(message_endpoints=(100, 200))
    assert chat.next_endpoint() == 100
    chat.consumed = 100  # exactly at an endpoint: the next one is ahead
    assert chat.next_endpoint() == 100
    chat.consumed = 150
    assert chat.next_endpoint() == 50
    chat.consumed = 200
    assert chat.next_endpoint() is None  # only the prompt end is left


@spec("prerequisites/atomic-span-chunk")
def test_image_spans_are_seen_from_the_cursor():
    req = request(image_spans=((50, 100), (300, 400)), consumed=100)
    assert req.spans_from_cursor() == ((200, 300),)  # the span that ends at the cursor is done


def test_a_request_needs_a_page_even_for_no_tokens():
    assert [pages_for(n, 16) for n in (0, 1, 16, 17)] == [1, 1, 1, 2]
