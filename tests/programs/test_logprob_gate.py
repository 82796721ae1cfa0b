"""The log-probability gate (`programs/scores.py`): scores only when a live lane's row asked.

- `token_logprobs` with some lane wanting scores returns exactly the ungated computation
  (log_softmax, the picked value, a top-20) for every lane; with none it returns NaN and token 0,
  and its skipping branch has no exp, no log and no top-k: the work is not done.
- Through the prepared programs (ordinary decode, B = 2): the `initialize` flag reaches the
  state; a batch with no flagged live row reports NaN (a flagged row outside the batch does not
  count); one flagged lane scores every lane, bit for bit what a batch with both flagged
  reports, and within 1e-4 of the full forward's log-softmax; tokens and state are the same bits
  whether or not anything was scored.
"""

import jax
import jax.numpy as jnp
import numpy as np

from helios_jax.model import forward_full_logits
from helios_jax.programs.inputs import TOP_LOGPROBS
from helios_jax.programs.scores import token_logprobs

from .helpers import DECODE, MODEL, Driver, as_bits

B, W, V = 3, 2, 50
PROMPTS = {0: [7, 3, 250, 1, 19, 19, 4, 88, 2], 2: [40, 2, 9, 33, 5]}


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(size=(B, W, V)).astype(np.float32))
    tokens = jnp.asarray(rng.integers(0, V, (B, W)).astype(np.int32))
    return logits, tokens


def test_gated_scores_equal_the_ungated_computation_or_are_skipped():
    logits, tokens = _inputs(0)
    gated = jax.jit(token_logprobs)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    top, ids = jax.lax.top_k(log_probs, TOP_LOGPROBS)
    want = dict(
        logprobs=jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0],
        top_logprobs=top,
        top_tokens=ids,
    )
    for wanted in ([True, False, False], [False, False, True], [True, True, True]):
        got = gated(logits, tokens, jnp.asarray(wanted))
        for name in want:  # every lane is scored, whichever asked
            np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-6, atol=0)
    got = gated(logits, tokens, jnp.zeros((B,), bool))
    assert np.isnan(np.asarray(got["logprobs"])).all() and np.isnan(np.asarray(got["top_logprobs"])).all()
    assert not np.asarray(got["top_tokens"]).any()


def _primitives(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple) else (value,):
                if hasattr(inner, "jaxpr") and hasattr(inner.jaxpr, "eqns"):
                    names |= _primitives(inner.jaxpr)
    return names


def test_the_skipping_branch_does_no_softmax_and_no_top_k():
    logits, tokens = _inputs(1)
    jaxpr = jax.make_jaxpr(token_logprobs)(logits, tokens, jnp.ones((B,), bool))
    (cond,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    skip, score = (_primitives(b.jaxpr) for b in cond.params["branches"])  # (false, true)
    assert {"exp", "log", "top_k"} <= score
    assert not {"exp", "log", "top_k", "reduce_max"} & skip


def _decode(programs, params, flags, lanes=(0, 2)):
    """Initializes slots 0 and 2 with `flags`, prefills them and runs one decode over `lanes`:
    (its outputs, the state, each slot's context: prompt + first output token)."""
    d = Driver(programs, params, seed=6)
    contexts = {}
    for slot, prompt in PROMPTS.items():
        d.initialize(slot, logprobs=flags[slot])
        contexts[slot] = list(prompt) + [d.prefill(slot, prompt)[0]]
    out = d.run(DECODE, slots=list(lanes), page_tables=d.tables(list(lanes)))
    return out, d.state, contexts


def test_decode_scores_only_batches_with_a_flagged_live_row(ordinary_programs, params):
    none, state_none, _ = _decode(ordinary_programs, params, {0: False, 2: False})
    one, state_one, contexts = _decode(ordinary_programs, params, {0: False, 2: True})
    both, _, _ = _decode(ordinary_programs, params, {0: True, 2: True})
    assert np.asarray(state_one.logprobs)[:3].tolist() == [False, False, True]  # initialize set it
    assert np.isnan(np.asarray(none.logprobs)).all() and not np.asarray(none.top_tokens).any()
    alone, _, _ = _decode(ordinary_programs, params, {0: True, 2: False}, lanes=(2,))  # padding reads row 0
    assert np.isnan(np.asarray(alone.logprobs)).all()
    for name in ("logprobs", "top_logprobs", "top_tokens"):
        np.testing.assert_array_equal(as_bits(getattr(one, name)), as_bits(getattr(both, name)))
    np.testing.assert_array_equal(np.asarray(none.tokens), np.asarray(one.tokens))
    for name in ("cursor", "pending", "rng", "generated", "last_hidden"):
        np.testing.assert_array_equal(as_bits(getattr(state_none, name)), as_bits(getattr(state_one, name)))
    for lane, slot in enumerate(PROMPTS):  # both lanes scored, against the full forward
        logits = forward_full_logits(MODEL, params, jnp.asarray(contexts[slot], jnp.int32))[-1]
        row = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)))
        token = int(one.tokens[lane, 0])
        assert abs(float(one.logprobs[lane, 0]) - row[token]) < 1e-4
        np.testing.assert_allclose(
            np.asarray(one.top_logprobs[lane, 0]), np.sort(row)[::-1][:TOP_LOGPROBS], atol=1e-4
        )
        np.testing.assert_allclose(
            row[np.asarray(one.top_tokens[lane, 0])], np.asarray(one.top_logprobs[lane, 0]), atol=1e-4
        )
