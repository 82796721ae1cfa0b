"""Complete speculative generation equals plain greedy decoding, and reports what the host needs.

Two requests (slots 1 and 3, prompts of 11 and 18 tokens: one and two prefill chunks) decode
through one speculative program shape at a time until each has 24 tokens. The reference is
greedy decoding by the cache-free full forward. Float32 forwards batched differently differ by
~1e-6, so equality is asserted on the prefix whose reference top-2 logit margins all exceed
MARGIN_TOL = 1e-4 (the test requires that prefix to hold at least 16 tokens).

Shapes: width one (D = 0), rectangular W = 4 (P = 8, host lengths), ragged W = 4 with device
allocation (P = 5, prefix_limit) and with host lengths (P = 6), and W = 2 < D + 1. Proposals are
learned (the random MTP head: mostly rejected) or copied from the reference continuation, with
one corrupted token every other round, so both full acceptance with a bonus token and rejection
at a chosen depth with a replacement token occur and are checked exactly.
"""

import numpy as np
import pytest

from helios_jax.catalog import Allocation
from helios_jax.model import forward_full
from helios_jax.reference.mtp import naive_proposals
from helios_jax.scheduler.rounds import allocate_prefix_rows

from .helpers import (
    MIXED_W1,
    MODEL,
    NARROW,
    RAGGED_DEVICE,
    RAGGED_HOST,
    RECT,
    SPECULATIVE_ENGINE,
    WIDTH_ONE,
    Driver,
    emitted,
    greedy_reference,
    hf_weights,
    reliable_prefix,
)

spec = pytest.mark.spec
SLOTS = (1, 3)
PROMPTS = (
    [5, 17, 99, 3, 250, 42, 42, 7, 1, 0, 128],
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 200, 201, 202, 203, 77, 66, 55, 44, 33],
)
STEPS = 24
SHAPES = {
    "width_one": WIDTH_ONE,
    "rect": RECT,
    "ragged_device": RAGGED_DEVICE,
    "ragged_host": RAGGED_HOST,
    "narrow": NARROW,
}
HOST_LENGTHS = {"rect": [4, 4], "ragged_host": [4, 2], "narrow": [2, 2], "width_one": [1, 1]}


@pytest.fixture(scope="module")
def reference(params):
    out = [greedy_reference(params, p, STEPS + 8) for p in PROMPTS]
    for _tokens, margins in out:
        assert reliable_prefix(margins) >= 16, "pick another seed: the reference is too close to ties"
    return out


def _start(spec_programs, params, page_seed=0, **sampling):
    d = Driver(spec_programs, params, seed=page_seed)
    streams = []
    for slot, prompt in zip(SLOTS, PROMPTS):
        d.initialize(slot, **sampling)
        first, _ = d.prefill(slot, prompt)
        streams.append([first])
    return d, streams


def _lengths(name, graph, round_index):
    if graph.allocation is Allocation.PREFIX_LIMIT:
        return dict(ceilings=[4, 3] if round_index % 2 else [4, 4])
    lengths = HOST_LENGTHS[name]
    return dict(query_lengths=lengths[::-1] if round_index % 2 else lengths)


def _copies(reference, streams, depth, round_index):
    """The reference continuation after each stream; every other round one token is corrupted."""
    out, corrupt = [], []
    for lane, (want, _) in enumerate(reference):
        done = len(streams[lane])
        prefix = list(want[done : done + depth])
        k = (round_index + lane) % depth if round_index % 2 else None
        if k is not None and k < len(prefix):
            prefix[k] = (prefix[k] + 1) % MODEL.vocab_size
        out.append(prefix)
        corrupt.append(k)
    return out, corrupt


@spec(
    "intro/speculative-graph-stages",
    "speculative-coverage/device-program-steps",
    "speculative-coverage/device-fixed-cohort",
    "speculative-coverage/querylength-fits-p",
    "speculative-coverage/copy-d",
    "speculative-coverage/learned-d",
    "useful-service/output-progress",
    "confidence-acceptance/survival-output",
)
@pytest.mark.parametrize("source", ["learned", "copy"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_greedy_speculation_equals_plain_greedy(spec_programs, params, reference, name, source):
    graph = SHAPES[name]
    if source == "copy" and graph.proposal_depth == 0:
        pytest.skip("width one draws no proposals")
    d, streams = _start(spec_programs, params)
    rounds = 0
    while min(len(s) for s in streams) < STEPS:
        host = dict(slots=list(SLOTS), page_tables=d.tables(SLOTS), **_lengths(name, graph, rounds))
        corrupt = [None, None]
        if source == "copy":
            host["copy_proposals"], corrupt = _copies(reference, streams, graph.proposal_depth, rounds)
        before = [d.row(s)["cursor"] for s in SLOTS]
        out = d.run(graph, **host)
        lengths = np.asarray(out.query_lengths)
        survival = np.asarray(out.survival)
        for lane, slot in enumerate(SLOTS):
            tokens = emitted(out, lane)
            n, evaluated = len(tokens), lengths[lane] - 1
            assert 1 <= n <= lengths[lane] <= graph.token_capacity
            # Greedy survival is 1 while the proposal was the argmax, 0 from the first miss.
            np.testing.assert_array_equal(
                survival[lane, :evaluated], (np.arange(evaluated) < n - 1).astype(np.float32)
            )
            assert np.all(survival[lane, evaluated:] == 0)
            want, margins = reference[lane]
            done = len(streams[lane])
            if source == "copy" and done + lengths[lane] <= reliable_prefix(margins):
                # Exact acceptance: all proposals up to the corrupted one survive.
                k = corrupt[lane]
                expected = evaluated + 1 if k is None or k >= evaluated else k + 1
                assert n == expected, (rounds, lane, k, evaluated, tokens)
            streams[lane].extend(tokens)
            assert d.row(slot)["cursor"] == before[lane] + n  # accepted-state commit
            assert d.row(slot)["pending"] == tokens[-1]
        if graph.allocation is Allocation.PREFIX_LIMIT:
            # The device allocation equals the host statement of the rule on the sidecar's joint
            # probabilities, within the immutable ceilings and P, for the fixed cohort.
            joint = np.asarray(out.sidecar)[1][list(SLOTS), : graph.proposal_depth]
            ceilings = host["ceilings"]
            np.testing.assert_array_equal(
                lengths, allocate_prefix_rows(joint, ceilings, [True, True], graph.target_capacity)
            )
            assert lengths.sum() == graph.target_capacity
        else:
            np.testing.assert_array_equal(lengths, host["query_lengths"])
        rounds += 1
    for lane, (want, margins) in enumerate(reference):
        n = min(reliable_prefix(margins), len(streams[lane]))
        assert streams[lane][:n] == want[:n], (lane, streams[lane][:n], want[:n])
    for lane, slot in enumerate(SLOTS):
        assert d.row(slot)["cursor"] == len(PROMPTS[lane]) + len(streams[lane]) - 1
        assert d.row(slot)["generated"] == len(streams[lane])


@spec(
    "confidence-acceptance/sidecar-shape",
    "confidence-acceptance/confidence-width",
    "speculative-coverage/device-fixed-cohort",
    "planning-queue/packed-round",
)
def test_sidecar_layout_covers_every_produced_prefix(spec_programs, params):
    d, _ = _start(spec_programs, params)
    program = d.program(RAGGED_DEVICE)
    assert program.confidence_width == RAGGED_DEVICE.proposal_depth
    out = d.run(RAGGED_DEVICE, slots=[3], page_tables=d.tables([3]), ceilings=[4])
    sidecar = np.asarray(out.sidecar)
    assert sidecar.dtype == np.float32
    assert sidecar.shape == (2, SPECULATIVE_ENGINE.request_slots, SPECULATIVE_ENGINE.draft_capacity)
    conf, joint = sidecar[0, 3], sidecar[1, 3]
    assert np.all((conf > 0) & (conf <= 1))  # every produced prefix is covered
    np.testing.assert_allclose(joint, np.cumprod(conf), rtol=1e-6)
    others = [s for s in range(SPECULATIVE_ENGINE.request_slots) if s != 3]
    assert np.all(sidecar[:, others] == 0)  # the cohort is fixed: no other slot is touched
    assert int(out.counts[1]) == 0 and int(out.query_lengths[1]) == 0


def _draft_confidence_reference(params, prompt, stream, depth):
    """Greedy proposals and their draft probabilities from the naive MTP oracle over the whole
    committed context: hidden states of positions 0..c-1, next tokens 1..c (c = cursor)."""
    sequence = list(prompt) + list(stream)  # the last token is the pending one
    cursor = len(sequence) - 1
    hidden = np.asarray(forward_full(MODEL, params, np.asarray(sequence[:cursor], np.int32)))
    return naive_proposals(hf_weights(params), MODEL, hidden, sequence[1 : cursor + 1], depth)


@spec(
    "speculative-coverage/width-one-draft-context",
    "mixed-execution/width-one-forward",
    "mixed-execution/adaptive-width-one-draft",
)
@pytest.mark.parametrize("width_one", ["speculative", "mixed"])
def test_width_one_keeps_the_draft_context_for_a_wider_round(spec_programs, params, width_one):
    """Width-one rounds (separate or mixed, D = 0) absorb each committed pair; a following
    W = 4 round's proposals then match the naive oracle over the whole context (the draft
    confidence of each greedy proposal is its oracle probability)."""
    d, streams = _start(spec_programs, params)
    for _ in range(5):
        if width_one == "speculative":
            out = d.run(WIDTH_ONE, slots=list(SLOTS), page_tables=d.tables(SLOTS), query_lengths=[1, 1])
        else:
            out = d.run(MIXED_W1, slots=list(SLOTS), page_tables=d.tables(SLOTS), query_lengths=[1, 1])
        for lane in range(2):
            streams[lane].extend(emitted(out, lane))
    out = d.run(RECT, slots=list(SLOTS), page_tables=d.tables(SLOTS), query_lengths=[4, 4])
    for lane, slot in enumerate(SLOTS):
        _, probs = _draft_confidence_reference(params, PROMPTS[lane], streams[lane], RECT.proposal_depth)
        np.testing.assert_allclose(np.asarray(out.sidecar)[0, slot, :3], probs, atol=1e-5)


@spec("speculative-coverage/copy-d")
def test_copy_prefix_shorter_than_depth_bounds_the_lane(spec_programs, params, reference):
    d, streams = _start(spec_programs, params)
    copies = [list(reference[0][0][1:2]), []]  # one supplied proposal, none
    out = d.run(
        RAGGED_DEVICE, slots=list(SLOTS), page_tables=d.tables(SLOTS), ceilings=[4, 4], copy_proposals=copies
    )
    lengths = np.asarray(out.query_lengths)
    assert lengths.tolist() == [2, 1]  # ceilings shrink to the supplied prefix + 1
    sidecar = np.asarray(out.sidecar)
    assert np.all(sidecar[:, SLOTS[0], 1:] == 0) and np.all(sidecar[:, SLOTS[1]] == 0)


@spec("speculative-coverage/learned-d")
def test_top_k_one_sampling_equals_greedy_and_the_seed_fixes_sampling(spec_programs, params, reference):
    """Sampled rounds with top_k = 1 go through the rejection-sampling path with point-mass p
    and q: the output equals greedy. With top_k = 0 the seed fixes every token."""
    d, streams = _start(spec_programs, params, temperature=0.9, top_k=1, seed=7)
    for _ in range(6):
        out = d.run(RECT, slots=list(SLOTS), page_tables=d.tables(SLOTS), query_lengths=[4, 4])
        for lane in range(2):
            streams[lane].extend(emitted(out, lane))
    for lane, (want, margins) in enumerate(reference):
        n = min(reliable_prefix(margins), len(streams[lane]))
        assert streams[lane][:n] == want[:n]

    def sampled_run(seed):
        d, streams = _start(spec_programs, params, temperature=1.0, top_p=0.95, seed=seed)
        for _ in range(4):
            out = d.run(RAGGED_DEVICE, slots=list(SLOTS), page_tables=d.tables(SLOTS), ceilings=[4, 4])
            for lane in range(2):
                streams[lane].extend(emitted(out, lane))
            surv = np.asarray(out.survival)
            assert np.all((surv >= 0) & (surv <= 1)) and np.all(np.diff(surv, axis=1)[:, :1] <= 1e-7)
        return streams

    assert sampled_run(11) == sampled_run(11)
    assert sampled_run(11) != sampled_run(12)


@spec("speculative-coverage/learned-d")
def test_greedy_learned_proposals_equal_the_paged_oracle(spec_programs, params):
    """The programs' proposal scan (per-lane sampling, copy lanes) reduces to the independent
    paged oracle `paged_proposals` for greedy learned lanes: same tokens, and the confidence is
    the oracle's q."""
    import jax
    import jax.numpy as jnp

    from helios_jax.programs.proposals import draft_proposals
    from helios_jax.programs.state import wrap_keys
    from helios_jax.reference.mtp import paged_proposals

    d, _ = _start(spec_programs, params)
    s = d.state
    slots = np.array(SLOTS)
    tables = jnp.asarray(np.array(d.tables(SLOTS), np.int32))
    cursor = s.cursor[slots]
    ours = jax.jit(
        lambda cache: draft_proposals(
            MODEL,
            params,
            cache,
            hidden=s.last_hidden[slots],
            pending=s.pending[slots],
            cursor=cursor,
            page_tables=tables,
            active=jnp.array([True, True]),
            temperature=jnp.zeros(2),
            top_k=jnp.zeros(2, jnp.int32),
            top_p=jnp.ones(2),
            key=wrap_keys(s.rng[slots]),
            copy_tokens=jnp.zeros((2, 3), jnp.int32),
            copy_lengths=jnp.full((2,), -1, jnp.int32),
            depth=3,
        )
    )(s.draft)
    theirs = jax.jit(
        lambda cache: paged_proposals(
            MODEL,
            params,
            cache,
            s.last_hidden[slots],
            s.pending[slots],
            cursor - 1,
            tables,
            jnp.array([True, True]),
            depth=3,
        )
    )(s.draft)
    np.testing.assert_array_equal(np.asarray(ours.tokens), np.asarray(theirs.tokens))
    np.testing.assert_allclose(np.asarray(ours.confidence), np.asarray(theirs.token_probs), atol=1e-6)
