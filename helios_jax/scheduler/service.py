"""Service prices (spec, "Useful service and selection"; docs/scheduling-utility.md).

Each resident request keeps a token rate x (tokens/ms) and, once decoding, a delivery rate z
(deliveries/ms), stored as natural logarithms so that long waits stay representable. Prices
are the gradients of the rate utility:

    prefill token   1 + f/x
    output token    beta + f/x
    delivery        g/z

with f = token_fairness, g = delivery_fairness, beta = output_token_value. After each measured
service interval of length dt (ms) every participant is updated with a = exp(-dt/tau),
tau = adaptation_ms:

    x <- a*x + (1 - a) * s/dt

where s is the service it received (zero for unselected participants). In log space this is a
``logaddexp``; an unserved request's log-rate falls by dt/tau, so its price grows geometrically
and waiting is bounded (the entropic dual update). Prices are kept in physical units (tokens
and deliveries per ms).

Missing histories: a request that has not been served yet has no token history. It is priced
as never better served than its share of the fastest *batch-feasible* generation rate over the
K residents, 1/sigma(K) with sigma(K) = K * T / min(B, K) minimised over the measured generation
programs (a program larger than K cannot serve more than K streams), nor than the worst-served
resident with a history, decaying from admission like any unserved participant
(:func:`missing_log_token_rate`); its first service starts the history from that rate. A
delivering stream without a delivery history is priced at the same share 1/sigma(K) of the K
decoders until its first published burst, which starts its history at one delivery over that
frame's measured duration.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from helios_jax.catalog import GraphDescriptor
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel

if TYPE_CHECKING:  # records of the lifecycle, which imports this module
    from helios_jax.scheduler.plan import Frame
    from helios_jax.scheduler.requests import Request

NS_PER_MS = 1_000_000

NEG_INF = -math.inf
# Stream rate assumed when no generation program is measured yet (cold start), per ms.
COLD_RATE = 1.0


def _log(x: float) -> float:
    return math.log(x) if x > 0 else NEG_INF


def decayed_log_rate(log_rate: float, served: float, interval_ms: float, tau_ms: float) -> float:
    """log(a*r + (1-a)*s/dt) with a = exp(-dt/tau), computed without leaving log space."""
    if interval_ms <= 0:
        raise ValueError(f"service interval must be positive, got {interval_ms}")
    if served < 0:
        raise ValueError(f"served amount must be nonnegative, got {served}")
    log_a = -interval_ms / tau_ms
    kept = log_a + log_rate
    if served == 0:
        return kept
    log_one_minus_a = math.log(-math.expm1(log_a))
    return _logaddexp(kept, log_one_minus_a + math.log(served / interval_ms))


def batch_feasible_interval(k: int, programs) -> float:
    """sigma = k * T / min(B, k) over the program minimising T / min(B, k); 0.0 when none.

    `programs`: (batch capacity, measured duration ms) pairs. A program larger than the stream
    count serves only k of its rows, so its rate is min(B, k) / T, never B / T.
    """
    if k <= 0:
        return 0.0
    best = min((t / min(b, k) for b, t in programs), default=math.inf)
    return k * best if math.isfinite(best) else 0.0


@dataclasses.dataclass(frozen=True)
class Normalizers:
    """The measured generation programs as (batch capacity, duration ms), frozen at commit.

    They give the batch-feasible per-stream rate that starts missing histories: with K streams,
    the fastest program serving min(B, K) of them per T ms delivers K / sigma streams per ms in
    all, 1 / sigma to each (sigma: :func:`batch_feasible_interval`).
    """

    generation: tuple[tuple[int, float], ...]
    # share_log_rate by stream count: read for every resident at every decision, and fixed with
    # the programs' estimates (the scheduler keeps one Normalizers per cost version).
    _shares: dict[int, float] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def measure(cls, graphs: Iterable[GraphDescriptor], costs: CostModel) -> Normalizers:
        """From the loaded programs' current estimates (stale ones count; unknown never invented)."""
        generation = [g for g in graphs if g.kind.is_generation]
        return cls.of(generation, {id(g): costs.estimate_ms(g.key) for g in generation})

    @classmethod
    def of(cls, graphs: Iterable[GraphDescriptor], durations: Mapping[int, float | None]) -> Normalizers:
        """:meth:`measure` from estimates already read, by program ``id`` (``PreparedGraphs.durations``)."""
        return cls(
            tuple(
                (g.batch_capacity, t)
                for g in graphs
                if g.kind.is_generation and (t := durations[id(g)]) is not None
            )
        )

    def share_log_rate(self, k: int) -> float:
        """log(1 / sigma(k)): each of k streams' share of the fastest batch-feasible rate.

        With nothing measured (cold start) the share is COLD_RATE / k.
        """
        k = max(1, k)
        share = self._shares.get(k)
        if share is None:
            sigma = batch_feasible_interval(k, self.generation)
            share = self._shares[k] = -math.log(sigma) if sigma > 0 else math.log(COLD_RATE / k)
        return share


@dataclasses.dataclass
class ServiceHistory:
    """A request's observed service rates (natural logs), None while missing."""

    log_x: float | None = None  # tokens per ms
    log_z: float | None = None  # deliveries per ms

    def copy(self) -> ServiceHistory:
        return ServiceHistory(self.log_x, self.log_z)


def missing_log_token_rate(
    normalizers: Normalizers, residents: int, known_log_rates, waited_ms: float, tau_ms: float
) -> float:
    """log of the token rate a request without a token history is priced at.

    It has received nothing yet, so it is never better served than its share 1/sigma(K) of the
    fastest batch-feasible rate over the K residents, nor than the worst-served resident that has
    a history; and like any unserved participant its rate decays from admission:

        log x0 = min(-log sigma(K), min_i log x_i) - waited/tau
    """
    return missing_base(normalizers, residents, known_log_rates) - max(0.0, waited_ms) / tau_ms


def missing_base(normalizers: Normalizers, residents: int, known_log_rates) -> float:
    """min(-log sigma(K), min_i log x_i): the missing rate before its decay since admission
    (the same for every request of one decision, so ``pricing.views`` computes it once)."""
    base = normalizers.share_log_rate(residents)
    known = [x for x in known_log_rates if x is not None]
    if known:
        base = min(base, min(known))
    return base


def resident_rates(
    requests: Mapping[int, Request], histories: Mapping[int, ServiceHistory]
) -> list[float | None]:
    """Every active resident's token rate (log, or None while missing) in `histories`."""
    return [histories[r.rid].log_x for r in requests.values() if r.active and r.rid in histories]


def missing_rate(
    req: Request, at_ns: int, norm: Normalizers, known: list[float | None], policy: PolicyConfig
) -> float:
    """The priced token rate of `req` at `at_ns` while it has no token history
    (:func:`missing_log_token_rate`); `known`: the residents' token rates (:func:`resident_rates`)."""
    return missing_log_token_rate(
        norm, len(known), known, (at_ns - req.admitted_ns) / NS_PER_MS, policy.adaptation_ms
    )


def record_interval(
    requests: Mapping[int, Request],
    frame: Frame,
    served: Mapping[int, float],
    interval_ms: float,
    policy: PolicyConfig,
) -> dict[int, float | None]:
    """One measured service interval of `frame` for every participant still resident (served
    output tokens, zero deliveries); returns each one's log z before that zero-delivery update,
    which its first publication replaces."""
    histories = {rid: r.history for rid, r in requests.items()}
    known = resident_rates(requests, histories)
    priors = {
        h.rid: missing_rate(requests[h.rid], frame.committed_ns, frame.normalizers, known, policy)
        for h in frame.participants
        if h.rid in requests and requests[h.rid].history.log_x is None
    }
    delivery_before = {}
    for h in frame.participants:
        req = requests.get(h.rid)
        if req is None or req.handle != h or req.cancelled:
            continue
        prior = priors.get(req.rid, 0.0)
        update_token_history(req.history, served.get(req.rid, 0.0), interval_ms, policy, prior)
        delivery_before[req.rid] = req.history.log_z
        req.history.log_z = delivery_update(req.history.log_z, 0.0, interval_ms, policy)
    return delivery_before


@dataclasses.dataclass(frozen=True)
class LogPrices:
    """Natural logs of a request's three prices (value units per token or delivery)."""

    prefill_token: float
    output_token: float
    delivery: float


def _logaddexp(a: float, b: float) -> float:
    """log(e^a + e^b) for Python floats (numpy's ufunc costs microseconds per scalar call)."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    if a == b:
        return a + math.log(2.0)
    big, small = (a, b) if a >= b else (b, a)
    return big + math.log1p(math.exp(small - big))


def log_prices(policy: PolicyConfig, log_x: float, log_z: float | None) -> LogPrices:
    """Prices as logs: 1 + f/x, beta + f/x, g/z (delivery -inf when there is no coordinate)."""
    return LogPrices(*price_logs(price_terms(policy), log_x, log_z))


def price_terms(policy: PolicyConfig) -> tuple[float, float, float]:
    """log f, log beta, log g: the policy's part of :func:`log_prices`, once per decision."""
    return _log(policy.token_fairness), _log(policy.output_token_value), _log(policy.delivery_fairness)


def price_logs(
    terms: tuple[float, float, float], log_x: float, log_z: float | None
) -> tuple[float, float, float]:
    """:func:`log_prices` as a plain triple (prefill token, output token, delivery) from
    :func:`price_terms`."""
    log_f, log_beta, log_g = terms
    log_f_over_x = log_f - log_x
    delivery = NEG_INF if log_z is None else log_g - log_z
    return _logaddexp(0.0, log_f_over_x), _logaddexp(log_beta, log_f_over_x), delivery


def price_columns(
    terms: tuple[float, float, float], log_x: list[float], log_z: list[float | None]
) -> tuple[list[float], list[float], list[float]]:
    """:func:`price_logs` of many requests at once (``pricing.views`` prices every resident):
    the prefill-token, output-token and delivery columns, as lists of floats, from the columns
    of log token rates and log delivery rates (None: no delivery coordinate, price -inf)."""
    if not log_x:
        return [], [], []
    log_f, log_beta, log_g = terms
    log_f_over_x = log_f - np.array(log_x, dtype=np.float64)
    delivery = [NEG_INF if z is None else log_g - z for z in log_z]
    return (
        np.logaddexp(0.0, log_f_over_x).tolist(),
        np.logaddexp(log_beta, log_f_over_x).tolist(),
        delivery,
    )


def update_token_history(
    history: ServiceHistory,
    served_tokens: float,
    interval_ms: float,
    policy: PolicyConfig,
    prior_log_x: float,
) -> None:
    """One measured interval of token service for one participant (zero when unselected).

    A missing history stays missing while the request is unserved (its waiting is priced by the
    decay of :func:`missing_log_token_rate`); its first service starts from `prior_log_x`, that
    missing rate at the interval's start.
    """
    if history.log_x is None and served_tokens <= 0:
        return
    base = prior_log_x if history.log_x is None else history.log_x
    history.log_x = decayed_log_rate(base, served_tokens, interval_ms, policy.adaptation_ms)


def delivery_update(
    log_z: float | None, deliveries: float, interval_ms: float, policy: PolicyConfig
) -> float | None:
    """The delivery rate after one interval; a missing history stays missing until published."""
    if log_z is None:
        return None
    return decayed_log_rate(log_z, deliveries, interval_ms, policy.adaptation_ms)


def first_delivery_log_rate(frame_ms: float) -> float:
    """A first published burst: one delivery over its measured frame duration."""
    if frame_ms <= 0:
        raise ValueError("frame duration must be positive")
    return -math.log(frame_ms)
