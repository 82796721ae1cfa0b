"""One fixed serving trace through the prepared programs, recorded for the tensor-parallel checks.

`record(programs, params)` drives two requests (slots 1 and 3) through: initialize (greedy,
log-probabilities on), scored prefill (two chunks and one), then speculative rounds of a
rectangular program (fixed allocation: host query lengths; one round with copy proposals) and of
a ragged program bound to the device allocation (adaptive allocation), learned proposals
elsewhere. It records everything the host reads (tokens, counts, lengths,
log-probabilities, sidecar, survival), the final state (both KV pools, last hidden states,
cursors) and the float32 logits of each row's newest hidden state.

The same trace run on one device and over a `tp` mesh must agree: integers exactly, floats
within 1e-5 (`compare`). Over a mesh every device is a rank holding its own copy of the outputs
and of the row state: `record` also asserts that those copies agree bitwise on every rank (the
emitted tokens, counts and query lengths, the committed cursor, pending token and count), that
every rank's confidence sidecar holds probabilities (`assert_ranks_agree`), and that each device
holds only its block of the KV pools and of the split weights (`assert_split`). Programs compile
lazily, so only the shapes used here are compiled.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import PartitionSpec

from helios_jax.model import compute_logits
from helios_jax.model.sharding import AXIS, KV_PAGES, param_shardings

from .helpers import RAGGED_DEVICE, RECT, Driver

SLOTS = (1, 3)
PROMPTS = (
    [5, 17, 99, 3, 250, 42, 42, 7, 1, 0, 128, 6, 9, 31, 2, 77, 8, 5, 17, 99, 3],
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 200],
)
TOL = 1e-5
# (graph, host lengths or ceilings, copy proposals?) per round.
ROUNDS = (
    (RECT, dict(query_lengths=[4, 3]), True),
    (RAGGED_DEVICE, dict(ceilings=[4, 4]), False),
    (RECT, dict(query_lengths=[4, 4]), False),
    (RAGGED_DEVICE, dict(ceilings=[4, 3]), False),
    (RECT, dict(query_lengths=[2, 4]), False),
)
_ROUND_FIELDS = ("tokens", "counts", "query_lengths", "logprobs", "top_logprobs", "top_tokens", "sidecar")


def _leaves(prefix: str, out, fields) -> dict[str, np.ndarray]:
    return {f"{prefix}.{f}": np.asarray(getattr(out, f)) for f in fields if getattr(out, f, None) is not None}


def record(programs, params) -> dict[str, np.ndarray]:
    """The trace's host-visible results and final state, by name (module docstring)."""
    params = programs.place_params(params)
    d = Driver(programs, params)
    got: dict[str, np.ndarray] = {}
    for slot, prompt in zip(SLOTS, PROMPTS):
        d.initialize(slot, logprobs=True)
        first, prompt_logprobs = d.prefill(slot, prompt, scored=True)
        got[f"prefill{slot}.first"] = np.asarray(first)
        got[f"prefill{slot}.prompt_logprobs"] = np.asarray(prompt_logprobs, np.float32)
    for i, (graph, lengths, copy) in enumerate(ROUNDS):
        host = dict(slots=list(SLOTS), page_tables=d.tables(SLOTS), **lengths)
        if copy:  # the request's own prompt continues where it would repeat; one token corrupted
            host["copy_proposals"] = [PROMPTS[0][:3], [1, 2, 3]]
        out = d.run(graph, **host)
        assert_ranks_agree(programs.mesh, out, f"round{i}")
        got.update(_leaves(f"round{i}", out, _ROUND_FIELDS))
        got[f"round{i}.survival"] = np.asarray(out.survival)
    s = d.state
    assert_ranks_agree(programs.mesh, s.replace(target=None, draft=None), "state")
    assert_split(programs.mesh, {"target": s.target, "draft": s.draft}, KV_PAGES)
    assert_split(programs.mesh, params, param_shardings(programs.mesh, params) if programs.mesh else None)
    for name in ("cursor", "pending", "generated", "last_hidden"):
        got[f"state.{name}"] = np.asarray(getattr(s, name))
    for pool in ("target", "draft"):
        got[f"state.{pool}.k"] = np.asarray(getattr(s, pool).k)
        got[f"state.{pool}.v"] = np.asarray(getattr(s, pool).v)
    got["logits"] = np.asarray(_logits(programs, params, s.last_hidden))
    return got


def assert_ranks_agree(mesh, tree, where: str) -> None:
    """Every device of `mesh` holds a whole, bitwise identical copy of each leaf of `tree`, and
    every copy of a `sidecar` leaf holds probabilities (in [0, 1]). No-op on one device."""
    if mesh is None:
        return
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = where + jax.tree_util.keystr(path)
        copies = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        assert len(copies) == mesh.size, name
        for copy in copies:
            assert copy.shape == leaf.shape, f"{name}: a rank holds {copy.shape} of {leaf.shape}"
            np.testing.assert_array_equal(copy, copies[0], err_msg=name)
            if name.endswith(".sidecar"):
                assert np.all((copy >= 0) & (copy <= 1)), name


def assert_split(mesh, tree, specs) -> None:
    """Each device holds only its block of every split leaf: the leaf's shape with each dimension
    that `specs` (one PartitionSpec, or a tree of NamedShardings) names `tp` divided by N.
    No-op on one device."""
    if mesh is None:
        return
    leaves = jax.tree_util.tree_leaves(tree)
    if isinstance(specs, PartitionSpec):
        specs = [specs] * len(leaves)
    else:
        specs = [sharding.spec for sharding in jax.tree_util.tree_leaves(specs)]
    assert len(specs) == len(leaves)
    for leaf, spec in zip(leaves, specs):
        axes = tuple(spec) + (None,) * (leaf.ndim - len(spec))
        block = tuple(n // mesh.size if axis == AXIS else n for n, axis in zip(leaf.shape, axes))
        assert {shard.data.shape for shard in leaf.addressable_shards} == {block}, (leaf.shape, spec)


def _logits(programs, params, hidden):
    """f32 logits of hidden states, computed as the programs do (vocabulary split over the mesh)."""
    config = programs.model_config
    if programs.mesh is None:
        return jax.jit(compute_logits, static_argnums=0)(config, params, hidden)
    replicated = jax.sharding.NamedSharding(programs.mesh, jax.sharding.PartitionSpec())
    fn = jax.jit(
        lambda p, h: compute_logits(config, p, h),
        in_shardings=(param_shardings(programs.mesh, params), replicated),
        out_shardings=replicated,
    )
    return fn(params, hidden)


def compare(single: dict[str, np.ndarray], sharded: dict[str, np.ndarray]) -> dict[str, float]:
    """Asserts the two traces agree (integers exactly, floats within TOL, NaN where NaN) and
    returns the largest absolute difference of every float entry."""
    assert single.keys() == sharded.keys()
    diffs = {}
    for name, want in single.items():
        have = sharded[name]
        assert have.shape == want.shape and have.dtype == want.dtype, name
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(have, want, rtol=0, atol=TOL, equal_nan=True, err_msg=name)
            both = np.isfinite(want) & np.isfinite(have)
            diffs[name] = float(np.max(np.abs(have - want)[both], initial=0.0))
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)
    return diffs
