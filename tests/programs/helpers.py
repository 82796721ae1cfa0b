"""Shared builders of the program tests: seeded models, small engines and a host-side driver.

The driver plays the runtime's part with plain host data: each request slot owns a shuffled,
fixed reservation of pages (the scheduler reserves the full execution ceiling), the rest of the
pool is never handed out, and the pool starts as NaN so that any read of an unwritten or foreign
page poisons the output. Every call goes through `Program.pack` (the runtime's packing path).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from helios_jax.catalog import Allocation, Catalog, GraphDescriptor, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.model import forward_full_logits, init_params, tiny_config
from helios_jax.programs import build_programs

MODEL = tiny_config(mtp_num_layers=1)
PAGE_SIZE = 4
MAX_LEN = 64
CHUNK = 16
MIXED_PROMPT = 64
# Greedy comparisons across differently batched float32 forwards only hold where the top-2 logit
# margin of the reference exceeds this (packed and full forwards differ by ~1e-6 here).
MARGIN_TOL = 1e-4

SPECULATIVE_ENGINE = EngineConfig(
    request_slots=4,
    prefill_chunks=(CHUNK,),
    speculation="adaptive",
    draft_tokens=3,
    speculative_token_capacity=16,
    max_model_len=MAX_LEN,
    page_size=PAGE_SIZE,
    kv_pages=88,
    snapshot_rows=1,
)
ORDINARY_ENGINE = SPECULATIVE_ENGINE.replace(speculation="off", draft_tokens=0, proposal_depths=None)


def spec_graph(b, w, d, p, allocation=Allocation.QUERY_LENGTH):
    return GraphDescriptor(
        GraphKind.SPECULATIVE, b, token_capacity=w, proposal_depth=d, target_capacity=p, allocation=allocation
    )


def mixed_graph(b, w, c, speculative):
    return GraphDescriptor(
        GraphKind.MIXED,
        b,
        token_capacity=w,
        proposal_depth=w - 1,
        prefill_capacity=c,
        target_capacity=c + (b - 1) * w,
        speculative=speculative,
    )


STATE_OPS = tuple(
    GraphDescriptor(k, 1) for k in (GraphKind.INITIALIZE, GraphKind.SNAPSHOT, GraphKind.RESTORE)
)
PREFILLS = (
    GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=CHUNK),
    GraphDescriptor(GraphKind.SCORED_PREFILL, 1, token_capacity=CHUNK),
)

# The speculative shapes the default suite compiles (HELIOS_ALL_SHAPES=1 adds a planned catalog).
WIDTH_ONE = spec_graph(2, 1, 0, 2)
RECT = spec_graph(2, 4, 3, 8)  # rectangular, host lengths
RAGGED_DEVICE = spec_graph(2, 4, 3, 5, Allocation.PREFIX_LIMIT)  # adaptive: device allocation
RAGGED_HOST = spec_graph(2, 4, 3, 6)  # fixed: host-allocated ragged
NARROW = spec_graph(2, 2, 3, 4)  # W < D + 1
MIXED_W1 = mixed_graph(4, 1, MIXED_PROMPT, True)
MIXED_W4 = mixed_graph(4, 4, MIXED_PROMPT, True)
MIXED_ORDINARY = mixed_graph(2, 1, MIXED_PROMPT, False)
DECODE = GraphDescriptor(GraphKind.DECODE, 2, token_capacity=1, target_capacity=2)
MULTISTEP_K = 4
DECODE_K = dataclasses.replace(DECODE, steps=MULTISTEP_K)  # the `multistep_programs` fixture's
WIDTH_ONE_K = dataclasses.replace(WIDTH_ONE, steps=MULTISTEP_K)  # the `spec_multistep_programs` fixture's


def speculative_catalog() -> Catalog:
    graphs = PREFILLS + (WIDTH_ONE, RECT, RAGGED_DEVICE, RAGGED_HOST, NARROW, MIXED_W1, MIXED_W4) + STATE_OPS
    return Catalog(
        "test-speculative",
        "speculative",
        SPECULATIVE_ENGINE.speculative_token_capacity,
        SPECULATIVE_ENGINE.request_slots,
        graphs,
    )


def ordinary_catalog() -> Catalog:
    graphs = PREFILLS + (DECODE, MIXED_ORDINARY) + STATE_OPS
    return Catalog(
        "test-ordinary",
        "ordinary",
        ORDINARY_ENGINE.speculative_token_capacity,
        ORDINARY_ENGINE.request_slots,
        graphs,
    )


def random_params(config, seed: int, scale: float = 0.1):
    """Seeded parameters with peaked enough distributions: matrices ~ N(0, scale), norm weights
    ~ 1 + N(0, 0.3) (the model tests' recipe)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))
    flat = {}
    for path, leaf in traverse_util.flatten_dict(shapes).items():
        value = (
            (1.0 + 0.3 * rng.standard_normal(leaf.shape))
            if path[-1] == "weight"
            else scale * rng.standard_normal(leaf.shape)
        )
        flat[path] = jnp.asarray(value, jnp.float32).astype(config.jnp_dtype)
    return traverse_util.unflatten_dict(flat)


def build(engine: EngineConfig, catalog: Catalog, params):
    return build_programs(MODEL, params, engine, catalog)


_full_logits = jax.jit(forward_full_logits, static_argnums=0)


def greedy_reference(params, prompt, steps: int):
    """Greedy continuation by the cache-free full forward (its own oracle, checked against
    transformers in tests/model), with the top-2 logit margin behind each token."""
    tokens, margins = [int(t) for t in prompt], []
    for _ in range(steps):
        padded = np.zeros((MAX_LEN,), np.int32)
        padded[: len(tokens)] = tokens
        logits = np.asarray(_full_logits(MODEL, params, jnp.asarray(padded)))[len(tokens) - 1]
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt) :], margins


def reliable_prefix(margins, tol: float = MARGIN_TOL) -> int:
    """Tokens from the start whose margins all exceed tol (beyond them streams may diverge)."""
    for i, m in enumerate(margins):
        if m < tol:
            return i
    return len(margins)


@dataclasses.dataclass
class Driver:
    """Host side of one engine: page reservations, packing, and the state threaded through."""

    programs: object
    params: object
    seed: int = 0
    fill: float = float("nan")

    def __post_init__(self):
        engine = self.programs.engine_config
        self.engine = engine
        self.state = self.programs.init_state(fill=self.fill)
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(engine.kv_pages)
        n = engine.pages_per_row
        self.pages = {
            row: [int(p) for p in order[row * n : (row + 1) * n]] for row in range(engine.state_rows)
        }
        self.unassigned = [int(p) for p in order[engine.state_rows * n :]]

    def program(self, graph: GraphDescriptor):
        return self.programs[graph.key]

    def run(self, graph: GraphDescriptor, **host):
        program = self.program(graph)
        self.state, out = program(self.params, self.state, program.pack(**host))
        return out

    def initialize(
        self,
        slot,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=0,
        coupled=False,
        logprobs=False,
        processors=None,
    ):
        init = self.programs.find(GraphKind.INITIALIZE, batch_capacity=1)
        host = dict(temperature=[temperature], top_p=[top_p], top_k=[top_k], seeds=[seed], coupled=[coupled])
        host.update(logprobs=[logprobs], processors=[processors])
        self.state, _ = init(self.params, self.state, init.pack(slots=[slot], **host))

    def prefill(self, slot, prompt, *, scored=False, tops=None):
        """Whole prompt in CHUNK-token chunks; returns (first output token, logprobs list).
        `tops` (scored): a list that receives each prompt token's (top log p, top ids) rows."""
        graph = PREFILLS[1] if scored else PREFILLS[0]
        logprobs, token = [], None
        for start in range(0, len(prompt), CHUNK):
            chunk = list(prompt[start : start + CHUNK])
            ends = start + CHUNK >= len(prompt)
            out = self.run(graph, slot=slot, tokens=chunk, page_table=self.pages[slot], prompt_ends=ends)
            if scored:
                logprobs.extend(np.asarray(out.prompt_logprobs)[: len(chunk)].tolist())
                if tops is not None:
                    values, ids = np.asarray(out.prompt_top_logprobs), np.asarray(out.prompt_top_tokens)
                    tops.extend(zip(values[: len(chunk)], ids[: len(chunk)]))
            if ends:
                assert int(out.counts[0]) == 1
                token = int(out.tokens[0])
        return token, logprobs

    def tables(self, slots):
        return [self.pages[s] for s in slots]

    def row(self, slot):
        s = self.state
        return dict(
            cursor=int(s.cursor[slot]), pending=int(s.pending[slot]), generated=int(s.generated[slot])
        )


def as_bits(x) -> np.ndarray:
    """Bitwise view (NaN payloads compare equal to themselves)."""
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


def emitted(out, lane: int) -> list[int]:
    return [int(t) for t in np.asarray(out.tokens)[lane, : int(out.counts[lane])]]


# Multi-step programs against single steps (test_multistep.py, test_multistep_width_one.py).
STEP_PROMPTS = {0: [5, 9, 17, 3, 3, 41, 7], 2: [11, 2, 60, 9, 1, 33, 8, 19, 4, 4, 2]}
SAMPLED = dict(temperature=0.9, top_p=0.95, top_k=40)
COUPLED = dict(SAMPLED, coupled=True)  # a seeded request: draws keyed by seed and position


def started(programs, params, sampling: dict) -> Driver:
    """A driver whose STEP_PROMPTS rows are initialized with `sampling` and prefilled."""
    d = Driver(programs, params, seed=3)
    for slot, prompt in STEP_PROMPTS.items():
        d.initialize(slot, seed=100 + slot, **sampling)
        d.prefill(slot, prompt)
    return d


def single_steps(d: Driver, graph: GraphDescriptor, slots, limits) -> list[list[int]]:
    """Single steps of `graph` (decode, or a width-one speculative round), lane by lane up to
    its limit: each lane's emitted tokens."""
    streams = [[] for _ in slots]
    for j in range(max(limits)):
        running = [s for s, n in zip(slots, limits) if j < n]
        host = dict(slots=running, page_tables=d.tables(running))
        if graph.kind is GraphKind.SPECULATIVE:
            host["query_lengths"] = [1] * len(running)
        out = d.run(graph, **host)
        for lane, slot in enumerate(running):
            streams[slots.index(slot)].extend(emitted(out, lane))
    return streams


def states_equal(a: Driver, b: Driver, slots, caches=("target",)) -> None:
    """The rows (cursor, pending token, output count, PRNG key) and the K/V of `caches` equal."""
    for s in slots:
        assert a.row(s) == b.row(s)
        assert np.array_equal(np.asarray(a.state.rng[s]), np.asarray(b.state.rng[s]))
    for cache in caches:
        for field in ("k", "v"):
            np.testing.assert_allclose(
                np.asarray(getattr(getattr(a.state, cache), field)),
                np.asarray(getattr(getattr(b.state, cache), field)),
                rtol=1e-5,
                atol=1e-5,
                equal_nan=True,
            )


def hf_weights(params) -> dict[str, np.ndarray]:
    """{transformers name: float64 ndarray} for the numpy references (reference/mtp.py)."""
    from helios_jax.model.weights import flax_path_to_hf_name

    out = {}
    for path, leaf in traverse_util.flatten_dict(params).items():
        name, transposed = flax_path_to_hf_name(path)
        array = np.asarray(jnp.asarray(leaf, jnp.float32), np.float64)
        out[name] = array.T if transposed else array
    return out
