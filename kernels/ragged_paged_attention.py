"""Ragged paged attention: one packed batch of prefill, verification and decode rows.

A prepared program packs the new query tokens of every row (one prefill chunk, speculative
verification rows, decode rows) into one array of static capacity T, and reads each row's
keys and values from the paged KV cache through its page table. This module computes the
attention of those packed rows.

Layout (shapes written once here; the entry checks them):
  q             [T, num_q_heads, head_dim]   packed query tokens, float32 or bfloat16
  k_pages       [num_kv_heads, total_pages, page_size, head_dim]
  v_pages       [num_kv_heads, total_pages, page_size, head_dim]
  page_tables   i32[R, pages_per_row]   page ids of each row's context, in order
  context_lens  i32[R]  valid context tokens of the row INCLUDING this step's new tokens
                        (already written into the pages before the call)
  query_starts  i32[R]  packed offset of the row's first query token
  query_lens    i32[R]  new tokens of the row (0: inactive row)
  returns       [T, num_q_heads, head_dim] in q's dtype; packed positions that no row covers are 0

Masking, as index arithmetic: query token i of row r sits at packed index
query_starts[r] + i and absolute position pos = context_lens[r] - query_lens[r] + i; it attends
to the keys at absolute positions 0..pos, key position s living in page
page_tables[r, s // page_size] at offset s % page_size. Worked example (page_size 4):
  row 0: context_lens 6, query_lens 2, query_starts 0, page_tables[0] = [7, 2, junk...]
         token 0 -> packed 0, pos 4: keys 0..4 = page 7 offsets 0..3, page 2 offset 0
         token 1 -> packed 1, pos 5: keys 0..5 (adds page 2 offset 1)
  row 1: context_lens 9, query_lens 1, query_starts 2: a decode token at pos 8, keys 0..8
         over pages page_tables[1, 0..2]
  packed capacity T = 4: packed position 3 belongs to no row and is returned as 0.
Grouped-query attention: q head h reads kv head h // (num_q_heads // num_kv_heads).

Garbage is expected and must not leak: page-table entries past ceil(context_len / page_size)
may be any integer (they are replaced by page 0 before any read), page contents past a row's
context may be NaN (keys and values there are zeroed before the products, scores masked), and
padding query tokens may be NaN (they are never read: query tiles substitute zeros).

Work decomposition (both implementations; `ragged_work_items.py`): each active row is cut into
tiles of `block_q` consecutive query tokens; a tile is one work item (row, first token). With
sum(query_lens) <= T there are at most min(T, ceil(T / block_q) + R) items (every tile holds a
token, every row at most one partial tile), a static bound, so the whole computation has static
shapes. block_q follows the packing density: T / R rounded up to a power of two, capped by the
tile table, so decode-only programs use 1-token tiles and prefill chunks wide ones.
Both paths run an online softmax over key blocks of whole pages and stop at the last key a
tile needs (its last token's position), not at the end of the row's page window: the XLA
path steps each group of consecutive work items together through as many blocks as the
group's longest item needs (gathers and einsums in a `fori_loop` with a traced trip count), the
Pallas path runs one program per (item, kv head) with its own trip count.
Softmax is float32 throughout; products take their inputs in q's dtype with float32 results.

Modules: this one is the entry (checks, the choice of implementation, one jitted dispatch) and
the naive reference; the XLA path is `ragged_attention_xla.py`, the Pallas kernel and its call
`ragged_attention_pallas.py`, the tile sizes and softmax constants both share
`ragged_attention_tiles.py`. Every public name stays importable from here.
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np

from helios_jax.kernels.jax_compat import is_tracer
from helios_jax.kernels.ragged_attention_pallas import (
    kv_splits,
    merge_splits,
    pallas_attention,
    pallas_shape_problem,
    ragged_paged_attention_kernel,
)
from helios_jax.kernels.ragged_attention_tiles import DEFAULT_TILES, RaggedAttentionTiles
from helios_jax.kernels.ragged_attention_xla import xla_attention
from helios_jax.kernels.raw_bits import as_float, bits_dtype

__all__ = [
    "DEFAULT_TILES",
    "IMPLS",
    "RaggedAttentionTiles",
    "kv_splits",
    "log_choice",
    "merge_splits",
    "pallas_shape_problem",
    "ragged_paged_attention",
    "ragged_paged_attention_kernel",
    "ragged_paged_attention_reference",
    "select_impl",
]

IMPLS = ("auto", "xla", "pallas")
_LOG = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Dispatch: the one choice of implementation and the jitted call of the chosen path.


def select_impl(impl: str, *, head_dim: int, page_size: int, pages_per_row: int) -> str:
    """The one place that resolves impl="auto": Pallas on a GPU (shapes permitting), else XLA."""
    if impl != "auto":
        return impl
    if jax.default_backend() == "gpu" and pallas_shape_problem(head_dim, page_size, pages_per_row) is None:
        return "pallas"
    return "xla"


@functools.cache
def log_choice(impl: str, resolved: str, *, backend: str, head_dim: int, page_size: int, pages_per_row: int):
    """Logs the implementation chosen, once per distinct (request, choice, backend, shape): a
    warning when "auto" falls back to XLA on a GPU because the Triton kernel cannot take the
    shape (a head_dim or page size that is not a power of two), else at info level."""
    shape = f"head_dim {head_dim}, page_size {page_size}, pages_per_row {pages_per_row}"
    problem = pallas_shape_problem(head_dim, page_size, pages_per_row)
    if impl == "auto" and resolved == "xla" and backend == "gpu" and problem:
        _LOG.warning("ragged paged attention runs on XLA on the GPU for %s: %s", shape, problem)
    else:
        _LOG.info("ragged paged attention: impl=%s (asked %s) on %s for %s", resolved, impl, backend, shape)


@functools.partial(jax.jit, static_argnames=("sm_scale", "impl", "interpret", "tiles"))
def _ragged_paged_attention_jit(
    q,
    k_pages,
    v_pages,
    page_tables,
    context_lens,
    query_starts,
    query_lens,
    layer,
    *,
    sm_scale,
    impl,
    interpret,
    tiles,
):
    """`layer` is a traced i32 scalar (None: one layer's pages), so every layer of one shape
    shares this trace and, on the Pallas path, one Triton kernel."""
    ints = [x.astype(jnp.int32) for x in (page_tables, context_lens, query_starts, query_lens)]
    if layer is None:  # one layer's pages: a stack of one (a free reshape)
        k_pages, v_pages, layer = k_pages[None], v_pages[None], 0
    layer = jnp.asarray(layer, jnp.int32)
    if impl == "pallas":  # a pool stored as bits (a CPU's 16-bit cache) is read as q's dtype
        k_pages, v_pages = as_float(k_pages, q.dtype), as_float(v_pages, q.dtype)
        return pallas_attention(
            q, k_pages, v_pages, *ints, sm_scale=sm_scale, tiles=tiles, interpret=interpret, layer=layer
        )
    return xla_attention(q, k_pages, v_pages, *ints, sm_scale=sm_scale, tiles=tiles, layer=layer)


# ---------------------------------------------------------------------------------------------
# Entry: checks, then the jitted dispatch.


def _check_shapes(q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens, impl):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if q.ndim != 3 or not jnp.issubdtype(q.dtype, jnp.floating):
        raise ValueError(f"q must be a float [T, num_q_heads, head_dim] array, got {q.dtype}{q.shape}")
    if k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(
            f"k_pages and v_pages must share one 4-d shape, got {k_pages.shape} and {v_pages.shape}"
        )
    # A float pool, or on a CPU a 16-bit float pool stored as its bits (kernels/raw_bits.py).
    stored = jnp.issubdtype(k_pages.dtype, jnp.floating) or k_pages.dtype == bits_dtype(q.dtype)
    if k_pages.dtype != v_pages.dtype or not stored:
        raise ValueError(
            f"k_pages and v_pages must share a float dtype, got {k_pages.dtype} and {v_pages.dtype}"
        )
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_pages.shape[0]
    if k_pages.shape[3] != head_dim:
        raise ValueError(f"head_dim differs: q {head_dim}, pages {k_pages.shape[3]}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if page_tables.ndim != 2 or not jnp.issubdtype(page_tables.dtype, jnp.integer):
        raise ValueError(
            "page_tables must be an integer [R, pages_per_row] array, got "
            f"{page_tables.dtype}{page_tables.shape}"
        )
    num_rows = page_tables.shape[0]
    if num_rows < 1:
        raise ValueError("page_tables must have at least one row")
    for name, x in (
        ("context_lens", context_lens),
        ("query_starts", query_starts),
        ("query_lens", query_lens),
    ):
        if x.shape != (num_rows,) or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer [{num_rows}] array, got {x.dtype}{x.shape}")


def _check_values(q, k_pages, page_tables, context_lens, query_starts, query_lens):
    num_tokens = q.shape[0]
    total_pages, page_size = k_pages.shape[1:3]
    tables, ctx, starts, lens = (
        np.asarray(x, np.int64) for x in (page_tables, context_lens, query_starts, query_lens)
    )
    active = lens > 0
    if (lens < 0).any():
        raise ValueError(f"query_lens must be >= 0, got {lens.tolist()}")
    if (active & (lens > ctx)).any():
        raise ValueError("a row's query_lens exceeds its context_lens (context includes the new tokens)")
    if (active & (ctx > tables.shape[1] * page_size)).any():
        raise ValueError(f"a context exceeds pages_per_row * page_size = {tables.shape[1] * page_size}")
    if (active & ((starts < 0) | (starts + lens > num_tokens))).any():
        raise ValueError(f"a row's query tokens fall outside the packed capacity {num_tokens}")
    order = np.argsort(starts[active], kind="stable")
    s, e = starts[active][order], (starts + lens)[active][order]
    if (s[1:] < e[:-1]).any():
        raise ValueError("rows' packed query ranges overlap")
    used = np.arange(tables.shape[1])[None, :] < (-(-ctx // page_size))[:, None]
    if (used & active[:, None] & ((tables < 0) | (tables >= total_pages))).any():
        raise ValueError(f"a used page-table entry is outside 0..{total_pages - 1}")


def _check_layer(k_pages, v_pages, layer):
    """Checks `layer` against the stacked pages. Returns (layer: None, a Python int or an i32
    scalar array, traced or not; what the shape checks see: one layer's k and v pages, shapes
    only for a stack)."""
    if layer is None:
        return None, (k_pages, v_pages)
    if k_pages.ndim != 5 or k_pages.shape != v_pages.shape:
        raise ValueError(
            f"with layer, k_pages and v_pages must share one 5-d [num_layers, num_kv_heads, "
            f"total_pages, page_size, head_dim] shape, got {k_pages.shape} and {v_pages.shape}"
        )
    num_layers = k_pages.shape[0]
    if isinstance(layer, (jax.Array, np.ndarray)) and not isinstance(layer, bool):
        if layer.shape != () or not jnp.issubdtype(layer.dtype, jnp.integer):
            raise ValueError(f"layer must be an int in [0, {num_layers}), got {layer.dtype}{layer.shape}")
        if is_tracer(layer):  # the caller's guarantee, as for the lengths
            return layer, _one_layer(k_pages, v_pages)
        layer = int(layer)
    elif isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise ValueError(f"layer must be an int in [0, {num_layers}), got {layer!r}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer must be an int in [0, {num_layers}), got {layer!r}")
    return int(layer), _one_layer(k_pages, v_pages)


def _one_layer(k_pages, v_pages):
    return tuple(jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in (k_pages, v_pages))


def ragged_paged_attention(
    q,
    k_pages,
    v_pages,
    page_tables,
    context_lens,
    query_starts,
    query_lens,
    *,
    sm_scale: float,
    impl: str = "auto",
    interpret: bool = False,
    tiles: RaggedAttentionTiles = DEFAULT_TILES,
    layer: int | jax.Array | None = None,
) -> jax.Array:
    """Causal attention of packed ragged query rows over a paged KV cache (module docstring).

    Shape checks always run; value checks (lengths, ranges, overlaps, used page ids) run where
    the integer inputs are concrete, i.e. not inside a caller's `jax.jit`. Under tracing the
    caller guarantees them; a violation then yields zeros or garbage rows, never an error.

    Args:
      q: [T, num_q_heads, head_dim] packed queries (float32 or bfloat16).
      k_pages, v_pages: [num_kv_heads, total_pages, page_size, head_dim]; with `layer`, every
        layer's pages, [num_layers, num_kv_heads, total_pages, page_size, head_dim].
      page_tables: i32[R, pages_per_row].
      context_lens, query_starts, query_lens: i32[R].
      sm_scale: logit scale, usually head_dim ** -0.5 (static).
      impl: "pallas", "xla", or "auto" (`select_impl`: Pallas on a GPU, XLA elsewhere).
      interpret: run the Pallas kernel in interpret mode (CPU tests); ignored by "xla".
      tiles: tile sizes (static; each distinct value compiles its own program).
      layer: the layer of stacked pages to read: a Python int or an integer scalar array, traced
        or not (it is a runtime value either way: all layers of one shape share one compiled
        kernel). Pass the whole stacked cache and the layer rather than `k_pages[layer]`: on
        the CPU that slice is a copy of the layer's whole cache at every call, which dominated
        decode steps with long windows.

    Returns:
      [T, num_q_heads, head_dim] in q's dtype; positions that no row covers are 0.
    """
    args = tuple(map(jnp.asarray, (q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens)))
    q, k_pages, v_pages, page_tables, context_lens, query_starts, query_lens = args
    layer, one_layer = _check_layer(k_pages, v_pages, layer)
    _check_shapes(q, *one_layer, page_tables, context_lens, query_starts, query_lens, impl)
    if not any(is_tracer(x) for x in (page_tables, context_lens, query_starts, query_lens)):
        _check_values(q, one_layer[0], page_tables, context_lens, query_starts, query_lens)
    shape = dict(head_dim=q.shape[2], page_size=k_pages.shape[-2], pages_per_row=page_tables.shape[1])
    resolved = select_impl(impl, **shape)
    if resolved == "pallas" and not interpret:
        problem = pallas_shape_problem(**shape)
        if problem:
            raise ValueError(problem)
    log_choice(impl, resolved, backend=jax.default_backend(), **shape)
    return _ragged_paged_attention_jit(
        *args, layer, sm_scale=float(sm_scale), impl=resolved, interpret=interpret, tiles=tiles
    )


def ragged_paged_attention_reference(
    q,
    k_pages,
    v_pages,
    page_tables,
    context_lens,
    query_starts,
    query_lens,
    *,
    sm_scale: float,
    layer: int | None = None,
) -> np.ndarray:
    """Deliberately naive: per row, per query token, float64 numpy. Returns float32 [T, H, D]."""
    if layer is not None:
        k_pages, v_pages = k_pages[layer], v_pages[layer]
    q = np.asarray(jnp.asarray(q, jnp.float32), np.float64)
    k_pages = np.asarray(jnp.asarray(k_pages, jnp.float32), np.float64)
    v_pages = np.asarray(jnp.asarray(v_pages, jnp.float32), np.float64)
    page_tables, context_lens, query_starts, query_lens = (
        np.asarray(x) for x in (page_tables, context_lens, query_starts, query_lens)
    )
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, page_size, _ = k_pages.shape
    group = num_q_heads // num_kv_heads
    out = np.zeros(q.shape, np.float64)
    for r in range(len(query_lens)):
        q_len, ctx = int(query_lens[r]), int(context_lens[r])
        if q_len == 0:
            continue
        pages = [int(p) for p in page_tables[r][: math.ceil(ctx / page_size)]]
        # [Hkv, ctx, D]: the row's context in order, read only from its used pages.
        k = np.concatenate([k_pages[:, p] for p in pages], axis=1)[:, :ctx]
        v = np.concatenate([v_pages[:, p] for p in pages], axis=1)[:, :ctx]
        for i in range(q_len):
            t = int(query_starts[r]) + i
            pos = ctx - q_len + i
            for h in range(num_q_heads):
                kv = h // group
                logits = k[kv, : pos + 1] @ q[t, h] * sm_scale
                weights = np.exp(logits - logits.max())
                out[t, h] = weights @ v[kv, : pos + 1] / weights.sum()
    return out.astype(np.float32)
