"""What both implementations of ragged paged attention share: tile sizes and softmax constants.

`kernels/ragged_paged_attention.py` is the entry and the reference; its XLA path is
`ragged_attention_xla.py`, its Pallas path `ragged_attention_pallas.py`, both over the work items
of `ragged_work_items.py`. Both run the same online softmax, in float32, with the constants below.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jax import lax

# Finite, so that a fully masked row never produces inf - inf = NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# float32 products stay float32 on GPUs too (their default would be TF32); no effect on
# bfloat16 inputs or on CPU.
EXACT = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class RaggedAttentionTiles:
    """Tile sizes. Untuned defaults: no GPU measured them (see docs/kernels.md)."""

    xla_block_q: int = 16  # most query tokens per XLA work item
    xla_block_k: int = 128  # keys per XLA online-softmax step (rounded down to whole pages)
    # Keys per step when the tiles are full (xla_block_q tokens: prompt chunks). A fresh chunk's
    # keys fit one such step; a decode or verification tile keeps the longer step, which its
    # long contexts favour (docs/kernels.md, `scripts/bench/attention_tiles.py`).
    xla_prompt_block_k: int = 64
    # Work items per XLA group: each group steps only through the key blocks its own items
    # need (a long prompt chunk's early tiles skip its later keys; padding items skip all).
    xla_item_group: int = 32
    pallas_block_rows: int = 64  # most (query token x q head) rows per Pallas program
    pallas_min_rows: int = 16  # tl.dot needs >= 16 rows
    pallas_block_k: int = 64  # keys per inner step, a whole number of pages
    # Split-KV (`ragged_attention_pallas.kv_splits`): 0 chooses by shape, growing the grid
    # toward pallas_target_programs (about 2 programs per SM of a 132-SM H200) in powers of two
    # up to pallas_max_kv_splits; a positive value forces that many splits (tests).
    pallas_kv_splits: int = 0
    pallas_target_programs: int = 256
    pallas_max_kv_splits: int = 32
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_TILES = RaggedAttentionTiles()
