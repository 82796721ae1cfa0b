"""CheckpointStore's contract, checked against plain-Python statements of its rules (spec, "Planning
and the execution queue", checkpoint paragraphs; docs/spec/RESOLUTIONS.md item 34).

- victims: ready, unpinned, published rows, ranked by role (extras, then anchors, then terminal
  captures), then least recent demand, then shorter endpoint; a terminal capture never evicts an
  anchor of its own request;
- destinations: the owner's unused guard (never for its own extras), else a free unguarded row,
  else (mandatory execution only) an unused guard, else the first victim; an optional capture
  never takes a row guarded for another request's later anchor;
- lookup: the longest ready, published checkpoint whose tokens are a proper prefix of the prompt.

The random-operation test keeps its own record of what the store holds (a model written from the
rules above, not from the store's code) and compares every query with it after every operation.
"""

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.scheduler.checkpoints import CheckpointStore, Role

# Eviction rank, written out: extras first, then anchors, then terminal captures (window rows are
# private and never victims).
RANK = {Role.EXTRA: 0, Role.ANCHOR: 1, Role.TERMINAL: 2}
OPTIONAL = (Role.EXTRA, Role.ANCHOR, Role.TERMINAL)


@dataclasses.dataclass
class Held:
    """The model's record of one occupied row."""

    tokens: tuple
    role: Role
    owner: int
    demand: int
    ready: bool = False
    pins: int = 0


def evicted_before(a: Held, b: Held) -> bool:
    """`a` goes strictly before `b`: lower role rank; same role, less recent demand; same role and
    demand, shorter endpoint."""
    if RANK[a.role] != RANK[b.role]:
        return RANK[a.role] < RANK[b.role]
    if a.demand != b.demand:
        return a.demand < b.demand
    return len(a.tokens) < len(b.tokens)


class Model:
    """Rows, guards and checkpoints as the contract describes them."""

    def __init__(self, size):
        self.size = size
        self.held: dict[int, Held] = {}
        self.guards: dict[int, int] = {}

    def free(self):
        return set(range(self.size)) - set(self.held)

    def eligible(self, owner, role):
        """Rows a capture of `role` for `owner` may evict."""
        return {
            r
            for r, h in self.held.items()
            if h.ready
            and h.pins == 0
            and h.role is not Role.WINDOW
            and not (role is Role.TERMINAL and h.role is Role.ANCHOR and h.owner == owner)
        }

    def first_victims(self, owner, role):
        rows = self.eligible(owner, role)
        return {r for r in rows if not any(evicted_before(self.held[o], self.held[r]) for o in rows)}

    def destinations(self, owner, role, mandatory):
        """The rows an arming may take (empty: nothing is obtainable)."""
        free = self.free()
        mine = {r for r in free if self.guards.get(r) == owner}
        if mine and role is not Role.EXTRA:
            return mine
        unguarded = free - set(self.guards)
        if unguarded:
            return unguarded
        if mandatory and free:
            return free  # every free row is an unused guard here: mandatory execution revokes one
        return self.first_victims(owner, role)

    def longest_prefix(self, prompt):
        prompt = tuple(prompt)
        published = [
            h.tokens
            for h in self.held.values()
            if h.ready and h.role is not Role.WINDOW and len(h.tokens) < len(prompt)
        ]
        prefixes = [t for t in published if prompt[: len(t)] == t]
        return max(prefixes, key=len, default=None)


def assert_eviction_order(rows, model, owner, role):
    assert sorted(rows) == sorted(model.eligible(owner, role))
    for a, b in zip(rows, rows[1:]):  # never a row evicted strictly before one listed ahead of it
        assert not evicted_before(model.held[b], model.held[a])


def ready(store, owner, tokens, role, now_ns):
    row = store.arm(owner, tokens, role, now_ns)
    store.captured(row, now_ns)
    return row


# -- directed cases ----------------------------------------------------------------------------


def test_victims_rank_by_role_then_least_recent_demand_then_shorter_endpoint():
    """Role dominates demand (a just-used extra goes before an old anchor, the oldest terminal
    capture goes last), demand dominates length, and length breaks the remaining tie; the order
    is the same whatever order the rows were captured in."""
    rows = {
        "terminal, oldest": (Role.TERMINAL, 1, (9,)),
        "anchor t9 long": (Role.ANCHOR, 9, (1, 2, 3)),
        "anchor t9 short": (Role.ANCHOR, 9, (1, 2)),
        "anchor t5": (Role.ANCHOR, 5, (4, 4, 4, 4)),
        "extra, newest": (Role.EXTRA, 50, (5, 5, 5, 5)),
    }
    expected = ["extra, newest", "anchor t5", "anchor t9 short", "anchor t9 long", "terminal, oldest"]
    for order in itertools.permutations(rows):
        store, by_row = CheckpointStore(5), {}
        for owner, label in enumerate(order):
            role, demand, tokens = rows[label]
            by_row[ready(store, owner, tokens, role, now_ns=demand)] = label
        assert [by_row[r] for r in store.victims(99)] == expected
        assert [by_row[r] for r in store.victims(99, role=Role.TERMINAL)] == expected


def test_a_terminal_capture_never_evicts_an_anchor_of_its_own_request():
    """RESOLUTIONS.md 34: request 1's terminal capture passes over its own (older) anchor and
    evicts request 2's; its own extras and earlier terminal state stay evictable. With only its
    own anchor eligible, the terminal capture is not obtainable, while the same request's other
    captures and another request's terminal capture may still take that row."""
    store = CheckpointStore(2)
    own = ready(store, 1, (1, 2), Role.ANCHOR, now_ns=1)
    other = ready(store, 2, (3, 4), Role.ANCHOR, now_ns=5)
    assert store.victims(1, role=Role.TERMINAL) == [other]
    assert store.victims(1, role=Role.ANCHOR) == [own, other]
    row = store.arm(1, (1, 2, 7, 8), Role.TERMINAL, now_ns=6)
    assert row == other and store.holds((1, 2)) and not store.holds((3, 4))
    assert not store.obtainable(1, role=Role.TERMINAL)  # the new terminal row is armed, own anchor kept
    with pytest.raises(LookupError):
        store.arm(1, (1, 2, 7), Role.TERMINAL, now_ns=7)
    assert store.entries[own].tokens == (1, 2)
    assert store.obtainable(1, role=Role.EXTRA) and store.obtainable(1, role=Role.ANCHOR)
    assert store.obtainable(2, role=Role.TERMINAL)
    store.captured(row, now_ns=8)
    assert store.victims(1, role=Role.TERMINAL) == [row]  # its own earlier terminal state
    store2 = CheckpointStore(2)
    extra = ready(store2, 1, (1,), Role.EXTRA, now_ns=9)
    anchor = ready(store2, 1, (1, 2), Role.ANCHOR, now_ns=0)
    assert store2.arm(1, (1, 2, 3), Role.TERMINAL, now_ns=10) == extra
    assert anchor in store2.entries


def test_an_optional_capture_evicts_a_victim_rather_than_take_another_requests_guard():
    """A free row guarded for request 7's later anchor is not for request 9's optional anchor:
    it evicts the ready extra instead and the guard stays. Request 7's own anchor takes the
    guarded row even while another row is free; its own extra does not."""
    store = CheckpointStore(2)
    guarded = store.guard(owner=7)
    extra = ready(store, 8, (1,), Role.EXTRA, now_ns=0)
    assert extra != guarded
    row = store.arm(9, (2, 2), Role.ANCHOR, now_ns=1)
    assert row == extra and store.guards == {guarded: 7} and not store.holds((1,))
    assert store.arm(7, (3, 3), Role.ANCHOR, now_ns=2) == guarded and store.guards == {}
    store = CheckpointStore(3)
    guarded = store.guard(owner=7)
    assert store.arm(7, (4,), Role.EXTRA, now_ns=0) != guarded  # protected from its own extra
    assert store.arm(7, (4, 4), Role.ANCHOR, now_ns=0) == guarded


def test_mandatory_execution_revokes_an_unused_guard_before_evicting():
    """A window row (mandatory) takes the unused guarded row rather than evict a ready checkpoint;
    with neither, nothing is obtainable, even for mandatory execution."""
    store = CheckpointStore(2)
    guarded = store.guard(owner=7)
    extra = ready(store, 8, (1,), Role.EXTRA, now_ns=0)
    assert store.obtainable(9, role=Role.ANCHOR)  # an optional capture would evict the extra
    window = store.arm(9, (), Role.WINDOW, now_ns=1, mandatory=True)
    assert window == guarded and store.guards == {} and store.holds((1,)) and extra in store.entries
    store.pin(extra, now_ns=2)
    assert not store.obtainable(10, mandatory=True, role=Role.WINDOW)
    with pytest.raises(LookupError):
        store.arm(10, (), Role.WINDOW, now_ns=3, mandatory=True)


def test_lookup_is_the_longest_ready_published_proper_prefix():
    """Against every prompt of up to four tokens over {1, 2, 3}: an unready capture, a private
    window row, the prompt itself and a non-prefix never answer; the longest qualifying does."""
    store = CheckpointStore(6)
    ready(store, 1, (1,), Role.EXTRA, now_ns=0)
    ready(store, 1, (1, 2, 3), Role.ANCHOR, now_ns=0)
    ready(store, 2, (1, 2), Role.TERMINAL, now_ns=0)
    ready(store, 3, (2, 3), Role.ANCHOR, now_ns=0)
    store.arm(4, (1, 2, 3, 1), Role.ANCHOR, now_ns=0)  # armed, not ready
    ready(store, 5, (), Role.WINDOW, now_ns=0)
    published = [(1,), (1, 2, 3), (1, 2), (2, 3)]
    for n in range(5):
        for prompt in itertools.product((1, 2, 3), repeat=n):
            fits = [t for t in published if len(t) < n and prompt[: len(t)] == t]
            hit = store.lookup(list(prompt))
            assert (hit and hit.tokens) == max(fits, key=len, default=None)


# -- random operation sequences ----------------------------------------------------------------

TOKENS = [t for n in (1, 2, 3) for t in itertools.product((1, 2), repeat=n)]
PROMPTS = [t for n in (1, 2, 3, 4) for t in itertools.product((1, 2), repeat=n)]
KINDS = ["arm"] * 4 + ["capture"] * 3 + ["restore", "unpin", "abandon", "guard", "release", "private"]
OP = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 2),  # owner
    st.sampled_from([*OPTIONAL, Role.WINDOW]),
    st.sampled_from(TOKENS),
    st.integers(0, 7),  # which row, among those an operation applies to
)


def do_arm(store, model, owner, role, tokens, now):
    mandatory = role is Role.WINDOW
    tokens = () if mandatory else tokens
    if not mandatory and any(h.tokens == tokens for h in model.held.values() if h.role is not Role.WINDOW):
        assert store.holds(tokens)
        return  # alias-aware callers never capture a stored prefix twice
    expected = model.destinations(owner, role, mandatory)
    assert store.obtainable(owner, mandatory=mandatory, role=role) == bool(expected)
    if not expected:
        with pytest.raises(LookupError):
            store.arm(owner, tokens, role, now, mandatory=mandatory)
        return
    row = store.arm(owner, tokens, role, now, mandatory=mandatory)
    assert row in expected
    model.guards.pop(row, None)
    model.held[row] = Held(tokens, role, owner, now, pins=1)


def do_op(store, model, pins, op, now):
    kind, owner, role, tokens, pick = op
    unready = sorted(r for r, h in model.held.items() if not h.ready)
    readable = sorted(r for r, h in model.held.items() if h.ready)
    idle_windows = sorted(r for r, h in model.held.items() if h.role is Role.WINDOW and h.pins == 0)
    if kind == "arm":
        do_arm(store, model, owner, role, tokens, now)
    elif kind == "capture" and unready:
        row = unready[pick % len(unready)]
        store.captured(row, now)
        model.held[row].ready, model.held[row].demand = True, now
        model.held[row].pins -= 1
    elif kind == "abandon" and unready:
        row = unready[pick % len(unready)]
        store.abandon(row)
        del model.held[row]
    elif kind == "restore" and readable:
        row = readable[pick % len(readable)]
        store.pin(row, now)
        model.held[row].pins, model.held[row].demand = model.held[row].pins + 1, now
        pins.append(row)
    elif kind == "unpin" and pins:
        row = pins.pop(pick % len(pins))
        store.unpin(row)
        model.held[row].pins -= 1
    elif kind == "guard":
        open_rows = model.free() - set(model.guards)
        row = store.guard(owner)
        assert (row is None) == (not open_rows) and (row is None or row in open_rows)
        if row is not None:
            model.guards[row] = owner
    elif kind == "release":
        store.release_guards(owner)
        model.guards = {r: o for r, o in model.guards.items() if o != owner}
    elif kind == "private" and idle_windows:
        row = idle_windows[pick % len(idle_windows)]
        (store.drop if pick % 2 else store.release_private)(row)
        del model.held[row]


def assert_matches(store, model):
    assert store.free_rows == model.size - len(model.held)
    assert store.owned_rows() == {r: h.owner for r, h in model.held.items()}
    for r, h in model.held.items():
        cp = store.entries[r]
        assert (cp.tokens, cp.role, cp.owner, cp.ready, cp.pins) == (
            h.tokens,
            h.role,
            h.owner,
            h.ready,
            h.pins,
        )
        assert cp.last_demand_ns == h.demand
    # A guard only ever reserves a free row: an occupied row is never guarded.
    assert store.guards == model.guards and set(model.guards) <= model.free()
    for owner, role in itertools.product(range(3), OPTIONAL):
        assert_eviction_order(store.victims(owner, role=role), model, owner, role)
    for prompt in PROMPTS:
        hit = store.lookup(prompt)
        assert (hit and hit.tokens) == model.longest_prefix(prompt)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.lists(OP, min_size=15, max_size=40))
def test_the_store_follows_its_contract_through_any_operation_sequence(size, ops):
    """Arming, capturing, abandoning, restoring, guarding and releasing in any order: every arming
    lands on a row the allocation rule allows (or fails exactly when none is obtainable), the
    victims are exactly the eligible rows in eviction order, lookups are the longest published
    proper prefixes, and guards only ever cover free rows. Demand times repeat (two operations
    per clock tick) so the endpoint-length tie-break is exercised."""
    store, model, pins = CheckpointStore(size), Model(size), []
    for i, op in enumerate(ops):
        do_op(store, model, pins, op, now=i // 2)
        assert_matches(store, model)
