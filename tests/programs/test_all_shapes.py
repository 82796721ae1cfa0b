"""Every prepared generation shape of planned catalogs equals plain greedy decoding (opt-in).

    HELIOS_ALL_SHAPES=1 .venv/bin/python -m pytest -q tests/programs/test_all_shapes.py

Plans adaptive and fixed catalogs (4 request slots, depths 1 and 3, R = 8, mixed prefill with a
64-token prompt bucket) with `EngineConfig.catalog`, and drives each speculative and mixed
program with every lane active: copy proposals from the reference continuation (one corrupted
token every other round) and learned proposals, until each request has 12 tokens. Tokens must
equal the full-forward greedy reference on its reliable prefix (margin > 1e-4). Not run in CI:
it compiles about forty programs.
"""

import os

import numpy as np
import pytest

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.programs import build_programs

from .helpers import MAX_LEN, MODEL, PAGE_SIZE, Driver, emitted, greedy_reference, reliable_prefix

pytestmark = pytest.mark.skipif(os.environ.get("HELIOS_ALL_SHAPES") != "1", reason="set HELIOS_ALL_SHAPES=1")
spec = pytest.mark.spec
STEPS = 12
PROMPTS = [[3 + i, 14, 15, 92, 65, 35 + i, 89, 79, 32 + 2 * i] for i in range(4)]


def _engine(speculation):
    return EngineConfig(
        request_slots=4,
        prefill_chunks=(16, 64),
        speculation=speculation,
        draft_tokens=3,
        proposal_depths=(1, 3),
        speculative_token_capacity=8,
        mixed_prefill=True,
        max_model_len=MAX_LEN,
        page_size=PAGE_SIZE,
        kv_pages=88,
    )


@pytest.fixture(scope="module", params=["adaptive", "fixed"])
def planned(request, params):
    engine = _engine(request.param)
    return build_programs(MODEL, params, engine, engine.catalog(request.param))


@pytest.fixture(scope="module")
def references(params):
    return [greedy_reference(params, p, STEPS + 8) for p in PROMPTS]


def _host_rows(shape, lanes):
    if shape.kind is GraphKind.SPECULATIVE and shape.allocation is Allocation.PREFIX_LIMIT:
        return dict(ceilings=[min(shape.width, shape.depth + 1)] * lanes)
    rows = [shape.width] * lanes
    while sum(rows) > shape.target_capacity:
        rows[rows.index(max(rows))] -= 1
    return dict(query_lengths=rows)


@spec(
    "speculative-coverage/recipe-shapes", "intro/speculative-graph-stages", "mixed-execution/shared-forward"
)
@pytest.mark.parametrize("source", ["copy", "learned"])
def test_every_planned_generation_shape(planned, params, references, source):
    prefill = planned.find(GraphKind.PREFILL, token_capacity=16).descriptor
    for program in planned.values():
        shape = program.shape
        if shape.kind not in (GraphKind.SPECULATIVE, GraphKind.MIXED):
            continue
        d = Driver(planned, params, seed=1)
        slots = list(range(min(shape.lanes, 4)))
        streams = []
        for s in slots:
            d.initialize(s)
            out = d.run(prefill, slot=s, tokens=PROMPTS[s], page_table=d.pages[s], prompt_ends=True)
            streams.append([int(out.tokens[0])])
        rounds = 0
        while min(len(x) for x in streams) < STEPS:
            host = dict(slots=slots, page_tables=d.tables(slots), **_host_rows(shape, len(slots)))
            if source == "copy" and shape.depth:
                copies = []
                for lane, s in enumerate(slots):
                    want = references[s][0]
                    prefix = list(want[len(streams[lane]) : len(streams[lane]) + shape.width - 1])
                    if rounds % 2 and prefix:
                        prefix[-1] = (prefix[-1] + 1) % MODEL.vocab_size
                    copies.append(prefix + [0] * (shape.width - 1 - len(prefix)))
                host["copy_proposals"] = copies
            out = d.run(program.descriptor, **host)
            for lane in range(len(slots)):
                streams[lane].extend(emitted(out, lane))
            rounds += 1
        for lane, s in enumerate(slots):
            want, margins = references[s]
            n = min(reliable_prefix(margins), len(streams[lane]))
            assert streams[lane][:n] == want[:n], (program.name, lane)
        assert np.all(np.asarray(out.counts)[: len(slots)] >= 1)
