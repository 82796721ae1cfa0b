"""A seeded family of generated catalogs: the property tests' population beyond the two shipped ones.

:func:`build` is ``build()`` of ``../shared/tools/make_catalog.py`` (the generator the shipped
``synthetic-h200`` catalogs came from), copied here (split into one helper per graph family, same
draws in the same order) so that a clean clone without ``../shared`` (CI) generates the same
catalogs; ``tests/test_catalog_family.py`` compares the two wherever the shared file exists.
Durations follow a roofline-style cost model of an 8B-class model on one H200-class GPU: every
graph reads the weights once (weights_ms), pays compute per target token (token_ms), attention
per row (row_ms), and the MTP head per proposal step (draft_ms + draft_row_ms * B), each
duration then jittered by a uniform factor.

:func:`family` samples the catalogs the scheduler's properties must hold on (issue 12): request
slots from {8, 16, 32, 64}; speculative token capacity R a power of two in 32..256 with R >= slots;
weights_ms, token_ms, row_ms and draft_ms each scaled by a factor uniform in [0.5, 1.5]; jitter
uniform in [0.1, 0.3]; a seed of its own per catalog; every fourth catalog ordinary, the others
speculative. The same (n, seed) gives the same catalogs, and family(n, seed) is a prefix of
family(m, seed) for m > n.

    python -m helios_jax.catalog_family N [SEED] [OUT_DIR]   # print (and write) the family
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib
import random
import sys
from collections.abc import Iterator

from helios_jax.catalog import Catalog


def build(
    scale=1.0,
    jitter=0.0,
    seed=0,
    name="synthetic-h200",
    slots=16,
    drafts=7,
    R=64,
    chunks=(64, 128, 256, 512, 1024, 2048, 4096),
    launch_ms=0.1,
    weights_ms=3.4,
    token_ms=0.021,
    row_ms=0.01,
    draft_ms=0.25,
    draft_row_ms=0.002,
    logprob_ms=0.004,
    mode="speculative",
):
    """A catalog as a JSON object: the catalogs of ``../shared/tools/make_catalog.py``'s build().

    Durations are drawn in graph order from one ``random.Random(seed)``, so the helpers below
    append their graphs in exactly the generator's order.
    """
    spec = mode == "speculative"
    rng = random.Random(seed)

    def ms(x):
        return round(x * scale * (1 + rng.uniform(-jitter, jitter)), 3)

    def base(tokens, rows, depth=0, b=1):
        draft = depth * (draft_ms + draft_row_ms * b)
        return launch_ms + weights_ms + token_ms * tokens + row_ms * rows + draft

    buckets = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= slots]
    widths = sorted({4, drafts + 1})
    g = _prefill_graphs(chunks, logprob_ms, ms, base)
    g += _decode_graphs(buckets, widths, R, spec, ms, base)
    g += _mixed_graphs(buckets, widths, chunks, R, spec, ms, base)
    g += _state_graphs(ms)
    description = (
        "Measured synthetic catalog: roofline-style costs of an 8B-class model on one H200-class GPU "
        f"(weights {weights_ms} ms per graph, {token_ms} ms per target token, MTP {draft_ms} ms per draft "
        f"step); {slots} request slots, "
        + (f"{drafts} draft tokens, speculative token capacity {R}." if spec else "ordinary decoding.")
    )
    return dict(
        name=name,
        mode=mode,
        speculative_token_capacity=R if spec else 0,
        request_slots=slots,
        description=description,
        graphs=g,
    )


def _prefill_graphs(chunks, logprob_ms, ms, base) -> list[dict]:
    """A prefill and a scored prefill per chunk size."""
    g = []
    for c in chunks:
        g.append(dict(kind="prefill", batch_capacity=1, token_capacity=c, duration_ms=ms(base(c, 1))))
        g.append(
            dict(
                kind="scored_prefill",
                batch_capacity=1,
                token_capacity=c,
                duration_ms=ms(base(c, 1) + logprob_ms * c),
            )
        )
    return g


def _decode_graphs(buckets, widths, R, spec, ms, base) -> list[dict]:
    """Ordinary decode per bucket in an ordinary catalog; in a speculative one, complete
    speculative programs per bucket: width one (keeps the draft context), then each width,
    rectangular with host allocation where B*W fits R, else ragged at P = R with device allocation."""
    g = []
    for b in buckets:  # ordinary decode only in an ordinary catalog
        if not spec:
            g.append(dict(kind="decode", batch_capacity=b, token_capacity=1, duration_ms=ms(base(b, b))))
    for b in buckets if spec else []:
        g.append(
            dict(
                kind="speculative",
                batch_capacity=b,
                proposal_depth=0,
                token_capacity=1,
                target_capacity=b,
                allocation="query_length",
                duration_ms=ms(base(b, b) + 0.05),
            )
        )
        for w in widths:
            d = w - 1
            if b * w <= R:
                g.append(
                    dict(
                        kind="speculative",
                        batch_capacity=b,
                        proposal_depth=d,
                        token_capacity=w,
                        target_capacity=b * w,
                        allocation="query_length",
                        duration_ms=ms(base(b * w, b, d, b)),
                    )
                )
            else:
                g.append(
                    dict(
                        kind="speculative",
                        batch_capacity=b,
                        proposal_depth=d,
                        token_capacity=w,
                        target_capacity=R,
                        allocation="prefix_limit",
                        duration_ms=ms(base(R, b, d, b) + 0.05),
                    )
                )
    return g


def _mixed_graphs(buckets, widths, chunks, R, spec, ms, base) -> list[dict]:
    """Mixed graphs per bucket of two or more rows: width one at every chunk size, and in a
    speculative catalog each wider width whose B*W fits R at the spec's balanced prompt bucket."""
    lo, hi = min(chunks), max(chunks)
    balanced = min(chunks, key=lambda p: (max(p / lo, hi / p), p))  # the spec's mixed prompt bucket
    g = []
    for b in buckets:
        if b < 2:
            continue
        for c in chunks:
            g.append(
                dict(
                    kind="mixed",
                    batch_capacity=b,
                    token_capacity=1,
                    prefill_capacity=c,
                    speculative=spec,
                    proposal_depth=0,
                    duration_ms=ms(base(c + b - 1, b) + 0.05 * spec),
                )
            )
        for w in widths if spec else []:
            d = w - 1
            if b * w <= R:
                g.append(
                    dict(
                        kind="mixed",
                        batch_capacity=b,
                        token_capacity=w,
                        prefill_capacity=balanced,
                        speculative=True,
                        proposal_depth=d,
                        target_capacity=balanced + (b - 1) * w,
                        duration_ms=ms(base(balanced + (b - 1) * w, b, d, b)),
                    )
                )
    return g


def _state_graphs(ms) -> list[dict]:
    """The state operations and one vision graph, at fixed costs."""
    return [
        dict(kind="initialize", batch_capacity=1, duration_ms=ms(0.2)),
        dict(kind="snapshot", batch_capacity=1, duration_ms=ms(0.3)),
        dict(kind="snapshot", batch_capacity=4, duration_ms=ms(0.5)),
        dict(kind="restore", batch_capacity=1, duration_ms=ms(0.35)),
        dict(kind="vision", batch_capacity=1, image_capacity=1, duration_ms=ms(6.0)),
    ]


SLOTS = (8, 16, 32, 64)
TOKEN_CAPACITIES = (32, 64, 128, 256)  # R, powers of two; only those >= slots are drawn
SCALED = ("weights_ms", "token_ms", "row_ms", "draft_ms")  # roofline constants scaled 0.5..1.5x
SCALE_RANGE = (0.5, 1.5)
JITTER_RANGE = (0.1, 0.3)
ORDINARY_EVERY = 4  # members 3, 7, 11, ... are ordinary-decoding catalogs
DEFAULTS = {k: p.default for k, p in inspect.signature(build).parameters.items()}


@dataclasses.dataclass(frozen=True)
class Member:
    """One generated catalog with the build() keywords that made it (``build(**params)``)."""

    index: int
    params: dict
    catalog: Catalog

    @property
    def name(self) -> str:
        return self.catalog.name

    def describe(self) -> str:
        p = self.params
        factors = ", ".join(f"{k[:-3]} x{p[k] / DEFAULTS[k]:.2f}" for k in SCALED)
        return (
            f"{p['mode']}, {p['slots']} slots, R={p['R']}, jitter {p['jitter']:.2f}, seed {p['seed']}; "
            f"{factors}"
        )


def sample_params(rng: random.Random, index: int, seed: int) -> dict:
    """The build() keywords of member `index`, drawn from `rng` (in a fixed order)."""
    slots = rng.choice(SLOTS)
    capacity = rng.choice([r for r in TOKEN_CAPACITIES if r >= slots])
    params = {"name": f"generated-{seed}-{index:03d}", "slots": slots, "R": capacity}
    for key in SCALED:
        params[key] = round(DEFAULTS[key] * rng.uniform(*SCALE_RANGE), 6)
    params["jitter"] = round(rng.uniform(*JITTER_RANGE), 4)
    params["seed"] = rng.randrange(1 << 31)
    params["mode"] = "ordinary" if index % ORDINARY_EVERY == ORDINARY_EVERY - 1 else "speculative"
    return params


def family(n: int, seed: int = 0) -> Iterator[Member]:
    """Yields `n` generated catalogs (seeded; a prefix of any longer family with the same seed)."""
    if n < 0:
        raise ValueError(f"a family has a nonnegative size, got {n}")
    rng = random.Random(seed)
    for index in range(n):
        params = sample_params(rng, index, seed)
        yield Member(index, params, Catalog.from_json(build(**params)))


def main(argv: list[str]) -> int:
    if not 2 <= len(argv) <= 4:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    n, seed = int(argv[1]), int(argv[2]) if len(argv) > 2 else 0
    out = pathlib.Path(argv[3]) if len(argv) > 3 else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for member in family(n, seed):
        print(json.dumps(member.params))
        if out is not None:
            member.catalog.save(out / f"{member.name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
