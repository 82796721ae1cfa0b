"""The engine's own invariant check, run after every step when the tests ask for it
(``HeliosEngine(check_invariants=True)``)."""

from __future__ import annotations


def verify_pool(scheduler, executor, inputs_by_rid) -> None:
    """The pool's occupancy equals the scheduler's reservations, and every frame in flight
    addresses only pages reserved for its lanes' requests (`inputs_by_rid`: rid -> the
    request's ``RequestInputs``, or None for a request that left)."""
    owned = scheduler.owned_pages()
    reserved = {}
    for rid, req in scheduler.requests.items():
        reserved.update({p: rid for p in req.pages})
    if owned != reserved:
        raise AssertionError(f"page pool {len(owned)} owned != {len(reserved)} reserved")
    for frame in executor.inflight:
        for lane in frame.plan.lanes:
            inputs = inputs_by_rid(lane.handle.rid)
            if inputs is not None and any(owned.get(p) != lane.handle.rid for p in inputs.page_table):
                raise AssertionError(f"fence {frame.fence}: {lane.handle} addresses pages it does not own")
