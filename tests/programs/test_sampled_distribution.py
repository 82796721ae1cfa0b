"""Sampled speculation through the prepared speculative program preserves the target distribution.

Both acceptance rules run through the rectangular W = 4, D = 3 program with learned proposals
from the (random) MTP head, in two settings where top-k and top-p both bind:
  broad   temperature 2, top-k 96, top-p 0.8: the target keeps ~74 of 256 tokens; the draft
          distribution q is truncated too and overlaps p enough for about a third of first
          proposals to be accepted;
  peaked  temperature 0.5, top-k 48, top-p 0.8: a sharper target, far from the law of a biased
          draw such as Gumbel noise added to p instead of log p.
In each, slot 1 is a seeded request (coupled: Gumbel-max draws keyed by seed and position,
acceptance by equality), slot 3 an unseeded one (rejection sampling, min(1, p/q)). Both have
the same prompt and run one round from the same state, DRAWS times with fresh keys: the
program's own function (`Program.fn`, the function the engine compiles) vmapped over the rows'
PRNG keys, so thousands of rounds cost one execution. Two trials are rerun through the prepared
program itself, one call each, and must give the same tokens.

The first emitted token must follow p_0, the filtered and tempered target distribution after
the pending token: chi-square goodness of fit against `sampling_probs_naive` of the cache-free
full forward, p >= 1e-3. In the broad setting, the second token of rounds that accepted the
first proposal must follow p(. | first), tested against the mixture of p(. | first) over those
rounds' first tokens (a sum of multinomials with unequal cell probabilities, for which
Pearson's statistic is conservative). A proposal drawn from the truncated q but judged against
the untruncated q moves the first token's law 0.18-0.22 (total variation) away from p_0 and
fails here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.programs.state import key_data
from helios_jax.reference.sampling import sampling_probs_naive

from .helpers import MAX_LEN, MODEL, RECT, Driver, _full_logits
from .test_acceptance import P_VALUE, chi_square_sf

PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 1, 0, 128]
# "broad": q overlaps p, drafts are often accepted (both tests); "peaked": a sharper target, where
# a biased draw (e.g. Gumbel noise added to p instead of log p) is far from p (first tokens).
SETTINGS = {
    "broad": dict(temperature=2.0, top_k=96, top_p=0.8),
    "peaked": dict(temperature=0.5, top_k=48, top_p=0.8),
}
COUPLED, REJECTION = 1, 3  # slots; lanes 0 and 1 of the round
DRAWS = 2048


@pytest.fixture(scope="module")
def vmapped_round(spec_programs, params):
    """RECT's own function, one round per key row: (template, inputs, u32[DRAWS, R, 2]) ->
    (tokens i32[DRAWS, 2, W], counts i32[DRAWS, 2]); compiled once for both settings."""
    program = spec_programs[RECT.key]

    def one_round(template, inputs, rng):
        _, out = program.fn(params, template.replace(rng=rng), inputs)
        return out.tokens, out.counts

    return jax.jit(jax.vmap(one_round, in_axes=(None, None, 0)))


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def rounds(request, spec_programs, params, vmapped_round):
    """(setting, the template's pending tokens, tokens i32[DRAWS, 2, W], counts i32[DRAWS, 2])."""
    setting = request.param
    d = Driver(spec_programs, params, seed=8)
    for slot in (COUPLED, REJECTION):
        d.initialize(slot, seed=77, coupled=slot == COUPLED, **SETTINGS[setting])
        d.prefill(slot, PROMPT)
    template = d.state
    program = d.program(RECT)
    slots = [COUPLED, REJECTION]
    inputs = program.pack(slots=slots, page_tables=d.tables(slots), query_lengths=[4, 4])
    rngs = np.repeat(np.asarray(template.rng)[None], DRAWS, axis=0)
    rngs[:, slots] = np.asarray(key_data(jnp.arange(2 * DRAWS, dtype=jnp.uint32))).reshape(DRAWS, 2, 2)
    device_inputs = jax.tree_util.tree_map(jnp.asarray, inputs)
    tokens, counts = (np.asarray(x) for x in vmapped_round(template, device_inputs, jnp.asarray(rngs)))
    for trial in (0, 1):  # the vmapped function is the prepared program
        state = jax.tree_util.tree_map(jnp.copy, template).replace(rng=jnp.asarray(rngs[trial]))
        _, out = program(params, state, inputs)
        for lane in range(2):
            n = int(out.counts[lane])
            assert n == counts[trial, lane]
            assert np.array_equal(np.asarray(out.tokens)[lane, :n], tokens[trial, lane, :n])
    pending = {slot: int(template.pending[slot]) for slot in slots}
    return setting, pending, tokens, counts


def _target(params, context, sampling: dict) -> np.ndarray:
    padded = np.zeros((MAX_LEN,), np.int32)
    padded[: len(context)] = context
    logits = np.asarray(_full_logits(MODEL, params, padded))[len(context) - 1]
    return sampling_probs_naive(logits, **sampling)


def _statistic(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and its cells; cells expecting < 5 are pooled into one."""
    expected = probs * counts.sum()
    assert counts[expected == 0].sum() == 0, "a token outside the filtered target was emitted"
    small = (expected < 5) & (expected > 0)
    observed = np.append(counts[expected >= 5], counts[small].sum())
    expected = np.append(expected[expected >= 5], expected[small].sum())
    keep = expected > 0
    stat = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    return stat, int(keep.sum())


@pytest.mark.parametrize("lane", [0, 1], ids=["coupled", "rejection"])
def test_first_two_tokens_follow_the_filtered_tempered_target(rounds, params, lane):
    setting, pending, tokens, counts = rounds
    context = PROMPT + [pending[(COUPLED, REJECTION)[lane]]]
    first = tokens[:, lane, 0]
    sampling = SETTINGS[setting]
    p0 = _target(params, context, sampling)
    top_p_alone = _target(params, context, dict(sampling, top_k=0))
    # Both filters bind: top-k cuts the top-p set, and top-p cuts inside the top-k set.
    assert 10 < np.count_nonzero(p0) < sampling["top_k"] < np.count_nonzero(top_p_alone)
    stat, cells = _statistic(np.bincount(first, minlength=MODEL.vocab_size), p0)
    assert chi_square_sf(stat, cells - 1) > P_VALUE
    if setting != "broad":
        return
    accepted = counts[:, lane] >= 2
    assert 0.1 < accepted.mean() < 0.9  # both branches of the rule occur often
    mixture = sum(
        np.count_nonzero(first[accepted] == token) * _target(params, context + [int(token)], sampling)
        for token in np.unique(first[accepted])
    )
    seconds = np.bincount(tokens[accepted, lane, 1], minlength=MODEL.vocab_size)
    stat, cells = _statistic(seconds, mixture / mixture.sum())
    assert chi_square_sf(stat, cells - 1) > P_VALUE
