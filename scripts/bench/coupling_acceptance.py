"""Acceptance of the coupled (seeded) rule against rejection sampling, on the embedded model.

    python scripts/bench/coupling_acceptance.py [--lanes=8] [--rounds=48] [--prompt_tokens=64]
        [--settings=0:0:1,0.6:0:1,1:0:1,1:40:0.9,1.3:0:1] [--repeats=2] [--seed=0] [--json_out=FILE]

Builds, for the embedded default model (float32, its trained MTP head), one prefill program, one
initialize program and one rectangular speculative program (B = --lanes, W = 4, D = 3, learned
proposals). For each sampling setting temperature:top_k:top_p and each rule, every lane
prefills its own --prompt_tokens-token window of the held-out standard-library text, then runs
--rounds rounds verifying all three drafts. "rejection" rows advance their key every round and
accept with min(1, p/q) (the spec's rule, unseeded requests); "coupled" rows draw by Gumbel-max
with noise keyed by (seed, position) and accept a draft when it equals the target's draw
(seeded requests, RESOLUTIONS.md 30). Both rules see the same prompts and lane seeds, repeated
--repeats times with other seeds.

Per setting and rule: tokens per target forward (accepted + 1, the mean over lane-rounds), the
fraction of rounds whose first k drafts were all accepted, and the conditional acceptance
alpha_k = P(draft k accepted | drafts before it accepted). Greedy (temperature 0) must give the
same figures under both rules (a consistency check, printed as such).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from absl import app, flags
from bench_common import DEFAULT_CACHE_DIR, machine, prompt_windows

from helios_jax.catalog import Allocation, Catalog, GraphDescriptor, GraphKind
from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.engine_config import EngineConfig
from helios_jax.programs import build_programs

FLAGS = flags.FLAGS
flags.DEFINE_integer("lanes", 8, "lanes (requests) per speculative program")
flags.DEFINE_integer("rounds", 48, "speculative rounds per lane and run")
flags.DEFINE_integer("prompt_tokens", 64, "tokens per prompt (one prefill chunk)")
flags.DEFINE_list("settings", ["0:0:1", "0.6:0:1", "1:0:1", "1:40:0.9", "1.3:0:1"], "temperature:top_k:top_p")
flags.DEFINE_integer("repeats", 2, "runs per setting and rule, with other lane seeds")
flags.DEFINE_integer("seed", 0, "seed of the prompt windows")
flags.DEFINE_string("json_out", None, "write the results as JSON here")
flags.DEFINE_string("compilation_cache_dir", DEFAULT_CACHE_DIR, "persistent compilation cache; empty: off")

DEPTH, WIDTH = 3, 4


def programs_for(model):
    lanes, chunk = FLAGS.lanes, FLAGS.prompt_tokens
    engine = EngineConfig(
        request_slots=lanes,
        prefill_chunks=(chunk,),
        speculation="fixed",
        draft_tokens=DEPTH,
        speculative_token_capacity=lanes * WIDTH,
        max_model_len=chunk + FLAGS.rounds * WIDTH + 16,
        page_size=16,
    )
    spec = GraphDescriptor(
        GraphKind.SPECULATIVE,
        lanes,
        token_capacity=WIDTH,
        proposal_depth=DEPTH,
        target_capacity=lanes * WIDTH,
        allocation=Allocation.QUERY_LENGTH,
    )
    graphs = (
        GraphDescriptor(GraphKind.PREFILL, 1, token_capacity=chunk),
        GraphDescriptor(GraphKind.INITIALIZE, 1),
        spec,
    )
    catalog = Catalog("coupling-bench", "speculative", engine.speculative_token_capacity, lanes, graphs)
    return build_programs(model.config, model.params, engine, catalog), engine, graphs


def run(programs, engine, graphs, params, prompts, setting, coupled: bool, seed: int) -> np.ndarray:
    """Accepted drafts i32[rounds, lanes] of one run."""
    prefill, init, spec = (programs[g.key] for g in graphs)
    temperature, top_k, top_p = setting
    n = engine.pages_per_row
    tables = [list(range(lane * n, (lane + 1) * n)) for lane in range(FLAGS.lanes)]
    state = programs.init_state()
    for lane, prompt in enumerate(prompts):
        host = dict(temperature=[temperature], top_p=[top_p], top_k=[top_k], seeds=[seed + lane])
        state, _ = init(params, state, init.pack(slots=[lane], coupled=[coupled], **host))
        state, _ = prefill(
            params, state, prefill.pack(slot=lane, tokens=prompt, page_table=tables[lane], prompt_ends=True)
        )
    inputs = spec.pack(
        slots=list(range(FLAGS.lanes)), page_tables=tables, query_lengths=[WIDTH] * FLAGS.lanes
    )
    accepted = []
    for _ in range(FLAGS.rounds):
        state, out = spec(params, state, inputs)
        accepted.append(np.asarray(out.counts) - 1)
    return np.asarray(accepted)


def figures(accepted: np.ndarray) -> dict:
    a = accepted.reshape(-1)
    reached = [float(np.mean(a >= k)) for k in range(1, DEPTH + 1)]
    offered = [1.0] + reached[:-1]
    return dict(
        lane_rounds=int(a.size),
        tokens_per_forward=float(np.mean(a + 1)),
        reached=reached,
        alpha=[r / o if o else None for r, o in zip(reached, offered)],
    )


def main(argv) -> int:
    del argv
    enable_compilation_cache(FLAGS.compilation_cache_dir)
    from helios_jax.model.default import load_default_model

    model = load_default_model("float32")
    prompts = [
        p["tokens"] for p in prompt_windows(model.tokenizer, FLAGS.lanes, FLAGS.prompt_tokens, FLAGS.seed)
    ]
    started = time.perf_counter()
    programs, engine, graphs = programs_for(model)
    results = dict(command=" ".join(sys.argv), machine=machine(), settings={})
    for text in FLAGS.settings:
        t, k, p = text.split(":")
        setting = (float(t), int(k), float(p))
        row = {}
        for rule in ("rejection", "coupled"):
            runs = [
                run(programs, engine, graphs, model.params, prompts, setting, rule == "coupled", 1000 * r)
                for r in range(FLAGS.repeats)
            ]
            row[rule] = figures(np.concatenate(runs, axis=1))
        ratio = row["coupled"]["tokens_per_forward"] / row["rejection"]["tokens_per_forward"]
        row["coupled_over_rejection_tokens_per_forward"] = ratio
        results["settings"][text] = row
        rej, cou = row["rejection"], row["coupled"]
        print(
            f"T={t} top_k={k} top_p={p}: tokens/forward rejection {rej['tokens_per_forward']:.3f}"
            f" coupled {cou['tokens_per_forward']:.3f} (x{ratio:.3f}); alpha_1"
            f" {rej['alpha'][0]:.3f} vs {cou['alpha'][0]:.3f}",
            flush=True,
        )
    results["seconds"] = round(time.perf_counter() - started, 1)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    app.run(main)
