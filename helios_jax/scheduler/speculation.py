"""Acceptance estimates (spec, "Completed confidence and acceptance").

Depth d (1-based) of a *prefix estimate* is the probability that the first d proposals of a
round all survive verification: s_1 >= s_2 >= ... For a round of width W (target rows including
the pending token) the expected committed output is

    E(W) = 1 + sum_{d=1}^{W-1} s_d ** alpha

bounded by the proposals actually available, the output limit and the remaining context; alpha
is ``adaptive_verification_alpha`` (default 1) and applies to selection scores only.

Estimators
----------
Each estimate keeps a mean and a weight per depth. It starts at a population prior with weight 2;
an observation x moves the mean by (x - mean) / (aged_weight + 1) and adds one to the weight,
capped at 128. Weights age with a half-life of 128 generated tokens of the request. Unobserved
depths keep their means (their weights still age). Ordinary selection uses the means; funded
acceptance learning uses the bounded optimistic estimate

    min(1, mean + sqrt(ln(20) / (2 * aged_weight))).

The population prior starts at 0.5**d and moves toward each completed observation at that depth
with weight 1/64. Requests track acceptance per proposal source (learned MTP proposals and copy
proposals learn separately); confidence forecasts (``rounds.py``) are a separate estimate of the
same shape.

Observations from a round (:func:`acceptance_observations`)
----------------------------------------------------------
A round offering k proposals of which a were accepted yields 1.0 at depths 1..a and 0.0 at the
longer offered depths a+1..k (a rejection zeroes every longer offered prefix). Termination
censors: depths beyond the point where the request ended get no observation. Where the program
wrote ``completion_speculative_survival`` (cumulative min(1, p/q)), those values replace the
binary observations at the depths they cover. Width-one rounds (k = 0) observe nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

try:  # np.clip's own ufunc: np.clip reaches it for float bounds after microseconds of dispatch
    from numpy._core.umath import clip as _clip  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - numpy < 2
    _clip = np.clip

INITIAL_WEIGHT = 2.0
WEIGHT_CAP = 128.0
HALF_LIFE_TOKENS = 128.0
PRIOR_RATE = 1.0 / 64.0
OPTIMISM_NUMERATOR = math.log(20.0)

SOURCE_LEARNED = "learned"  # MTP / draft-model proposals
SOURCE_COPY = "copy"  # copy proposals from a supplied prefix
SOURCES = (SOURCE_LEARNED, SOURCE_COPY)


def initial_prior(depth: int) -> np.ndarray:
    """0.5 ** d for d = 1..depth."""
    return 0.5 ** np.arange(1, depth + 1, dtype=np.float64)


def monotone(prefix: np.ndarray) -> np.ndarray:
    """Joint survival cannot grow with depth: the running minimum, clipped to [0, 1]."""
    return np.minimum.accumulate(_clip(prefix, 0.0, 1.0), axis=-1) if prefix.size else prefix


class PopulationPrior:
    """The shared starting point of new estimates: 0.5**d, moving 1/64 toward observations."""

    def __init__(self, depth: int):
        self.mean = initial_prior(depth)

    @property
    def depth(self) -> int:
        return self.mean.size

    def observe(self, observations: np.ndarray) -> None:
        """observations: f64[depth] with NaN where unobserved."""
        obs = _fit(observations, self.depth)
        seen = ~np.isnan(obs)
        self.mean[seen] += (obs[seen] - self.mean[seen]) * PRIOR_RATE

    def copy(self) -> PopulationPrior:
        new = PopulationPrior(0)
        new.mean = self.mean.copy()
        return new


def _fit(values: np.ndarray | Sequence[float], depth: int) -> np.ndarray:
    out = np.full(depth, np.nan)
    arr = np.asarray(values, dtype=np.float64).reshape(-1)[:depth]
    out[: arr.size] = arr
    return out


@dataclasses.dataclass
class PrefixEstimate:
    """Per-depth means and weights with token-based aging.

    An estimate started from a prior (:meth:`from_prior`) remembers that starting point
    (``origin``) and, per depth, the share of its mean the starting weight still carries
    (``prior_share``: 1 at the start, times w/(w + 1) at each observation of aged weight w).
    Selection reads the mean hierarchically (:meth:`means` with a ``pool``): the starting
    share is moved from the origin to the pooled estimate of every request's completed
    observations, so a request whose own evidence is thin is priced like the population rather
    than like the prior it was admitted with (docs/spec/RESOLUTIONS.md, 17).

    `means()` and `optimistic(tokens)` are read for every resident at every decision and change
    only when a round is observed or the pool moves: both are cached, and returned read-only.
    """

    mean: np.ndarray  # f64[depth]
    weight: np.ndarray  # f64[depth], as of `tokens_at`
    tokens_at: int = 0  # the request's generated-token count when weights were last aged
    origin: np.ndarray | None = None  # the prior the estimate started from (None: all own evidence)
    prior_share: np.ndarray | None = None  # f64[depth]: the share of `mean` that `origin` carries
    revision: int = dataclasses.field(default=0, compare=False)  # bumped by every observation
    _cache: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # observe() updates these in place in double precision: an estimate a caller preseeds
        # with integer or float32 arrays (Scheduler.admit's acceptance_history) reads them as
        # float64, as from_prior's do (float64 arrays are kept, not copied).
        self.mean = np.asarray(self.mean, dtype=np.float64)
        self.weight = np.asarray(self.weight, dtype=np.float64)
        if self.prior_share is not None:
            self.prior_share = np.asarray(self.prior_share, dtype=np.float64)

    @classmethod
    def from_prior(cls, prior: np.ndarray, tokens: int = 0) -> PrefixEstimate:
        prior = np.asarray(prior, dtype=np.float64)
        return cls(
            prior.copy(),
            np.full(prior.size, INITIAL_WEIGHT),
            tokens,
            origin=prior.copy(),
            prior_share=np.ones(prior.size),
        )

    @property
    def depth(self) -> int:
        return self.mean.size

    def aged_weight(self, tokens: int) -> np.ndarray:
        elapsed = max(0, tokens - self.tokens_at)
        return self.weight * 0.5 ** (elapsed / HALF_LIFE_TOKENS)

    def observe(self, observations: np.ndarray | Sequence[float], tokens: int) -> None:
        """Fold one round's observations (NaN = unobserved) in at generated-token count `tokens`."""
        obs = _fit(observations, self.depth)
        if np.any((obs < 0) | (obs > 1)):
            raise ValueError(f"acceptance observations must lie in [0, 1], got {obs}")
        w = self.aged_weight(tokens)
        seen = ~np.isnan(obs)
        self.mean[seen] += (obs[seen] - self.mean[seen]) / (w[seen] + 1.0)
        if self.prior_share is not None:
            self.prior_share[seen] *= w[seen] / (w[seen] + 1.0)
        w[seen] = np.minimum(w[seen] + 1.0, WEIGHT_CAP)
        self.weight = w
        self.tokens_at = max(self.tokens_at, tokens)
        self.revision += 1
        self._cache.clear()

    def _pooled_mean(self, pool: PrefixEstimate | None) -> np.ndarray:
        """The mean with its starting share moved from the origin to `pool`'s mean."""
        if pool is None or self.origin is None:
            return self.mean
        return self.mean + self.prior_share * (pool.mean - self.origin)

    def means(self, pool: PrefixEstimate | None = None) -> np.ndarray:
        """Prefix-survival means (made non-increasing); hierarchical when a `pool` is given."""
        key = ("means", None if pool is None else (id(pool), pool.revision))
        cached = self._cache.get(key[0])
        if cached is None or cached[0] != key:
            cached = self._cache[key[0]] = (key, _frozen(monotone(self._pooled_mean(pool))))
        return cached[1]

    def optimistic(self, tokens: int, pool: PrefixEstimate | None = None) -> np.ndarray:
        """min(1, mean + sqrt(ln 20 / (2 * aged weight))), on the same (pooled) mean."""
        key = ("optimistic", tokens, None if pool is None else (id(pool), pool.revision))
        cached = self._cache.get(key[0])
        if cached is None or cached[0] != key:
            bonus = np.sqrt(OPTIMISM_NUMERATOR / (2.0 * self.aged_weight(tokens)))
            value = _frozen(monotone(np.minimum(1.0, self._pooled_mean(pool) + bonus)))
            cached = self._cache[key[0]] = (key, value)
        return cached[1]

    def copy(self) -> PrefixEstimate:
        return PrefixEstimate(
            self.mean.copy(),
            self.weight.copy(),
            self.tokens_at,
            origin=None if self.origin is None else self.origin.copy(),
            prior_share=None if self.prior_share is None else self.prior_share.copy(),
        )


def batch_estimates(
    estimates: Sequence[PrefixEstimate],
    tokens: Sequence[int],
    pool: PrefixEstimate | None,
    optimistic: bool = True,
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """``means(pool)`` and ``optimistic(tokens[i], pool)`` of many estimates of one depth as
    rows of two read-only matrices: the same elementwise arithmetic, one numpy call per step
    for all of them instead of several per estimate (``pricing.views`` reads every resident).
    `optimistic` false: the means only (None in place of the optimistic rows)."""
    mean = np.array([e.mean for e in estimates], dtype=np.float64)
    pooled = mean
    rows = [i for i, e in enumerate(estimates) if e.origin is not None]
    if pool is not None and rows:
        origin = np.array([estimates[i].origin for i in rows])
        share = np.array([estimates[i].prior_share for i in rows])
        pooled = mean.copy()
        pooled[rows] = mean[rows] + share * (pool.mean - origin)
    means = monotone(pooled)
    means.setflags(write=False)
    if not optimistic:
        return list(means), None
    weight = np.array([e.weight for e in estimates], dtype=np.float64)
    aged = [0.5 ** (max(0, t - e.tokens_at) / HALF_LIFE_TOKENS) for e, t in zip(estimates, tokens)]
    bonus = np.sqrt(OPTIMISM_NUMERATOR / (2.0 * (weight * np.array(aged)[:, None])))
    upper = monotone(np.minimum(1.0, pooled + bonus))
    upper.setflags(write=False)
    return list(means), list(upper)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)
    a.setflags(write=False)
    return a


class AcceptanceHistory:
    """A request's acceptance estimates, one per proposal source."""

    def __init__(
        self,
        priors: dict[str, PopulationPrior],
        tokens: int = 0,
        preseeded: dict[str, PrefixEstimate] | None = None,
    ):
        self.estimates = {s: PrefixEstimate.from_prior(p.mean, tokens) for s, p in priors.items()}
        for source, est in (preseeded or {}).items():
            if source not in self.estimates:
                raise ValueError(f"unknown proposal source {source!r}")
            self.estimates[source] = est.copy()

    def get(self, source: str) -> PrefixEstimate:
        try:
            return self.estimates[source]
        except KeyError:
            raise ValueError(f"unknown proposal source {source!r}") from None

    def copy(self) -> AcceptanceHistory:
        new = AcceptanceHistory({})
        new.estimates = {s: e.copy() for s, e in self.estimates.items()}
        return new


def acceptance_observations(
    depth: int,
    offered: int,
    accepted: int,
    *,
    terminated_after: int | None = None,
    survival: Sequence[float] | None = None,
) -> np.ndarray:
    """Per-depth observations of one completed round (NaN where unobserved).

    Args:
      depth: length of the returned vector (the estimate's depth).
      offered: proposals offered for verification (round width minus one).
      accepted: proposals accepted (0..offered).
      terminated_after: if the request ended after committing this many of the round's accepted
        proposals (a stop or limit among them), deeper depths are censored.
      survival: optional ``completion_speculative_survival`` values for depths 1..len(survival);
        they replace the binary observations there.
    """
    if not 0 <= accepted <= offered:
        raise ValueError(f"accepted={accepted} must lie in [0, offered={offered}]")
    obs = np.full(depth, np.nan)
    k = min(offered, depth)
    obs[: min(accepted, k)] = 1.0
    obs[min(accepted, k) : k] = 0.0
    if terminated_after is not None:
        obs[max(0, terminated_after) :] = np.nan
    if survival is not None:
        surv = np.asarray(survival, dtype=np.float64).reshape(-1)
        if np.any(~np.isfinite(surv)) or np.any((surv < 0) | (surv > 1)):
            raise ValueError(f"survival values must be probabilities, got {surv}")
        n = min(surv.size, k)
        covered = ~np.isnan(obs[:n])
        obs[:n][covered] = surv[:n][covered]
    return obs


def expected_output(survival: np.ndarray, width: int, alpha: float = 1.0) -> float:
    """E(W) = 1 + sum_{d<W} s_d ** alpha for one lane (width already bounded by limits)."""
    if width <= 0:
        return 0.0
    s = monotone(np.asarray(survival, dtype=np.float64))[: width - 1]
    return 1.0 + float(np.sum(s**alpha))


def expected_output_table(survival: np.ndarray, max_width: int, alpha: float = 1.0) -> np.ndarray:
    """E(w) for w = 0..max_width for many lanes at once: f64[N, max_width + 1].

    survival: f64[N, depth] prefix estimates (made monotone here). Widths beyond the depth add
    nothing, so the caller bounds widths by proposals, output limits and context separately.
    """
    return monotone_expected_output_table(monotone(np.asarray(survival, dtype=np.float64)), max_width, alpha)


def monotone_expected_output_table(surv: np.ndarray, max_width: int, alpha: float) -> np.ndarray:
    """:func:`expected_output_table` of f64[N, depth] estimates that are already monotone and in
    [0, 1] (``monotone``'s output, as a lane table's survival is)."""
    n = surv.shape[0]
    table = np.zeros((n, max_width + 1))
    if max_width >= 1:
        table[:, 1] = 1.0
    cols = min(max_width - 1, surv.shape[1])  # survival terms: none below width two
    if cols > 0:
        head = surv[:, :cols]
        # np.cumsum's own accumulation, without its dispatch; x ** 1.0 would be a copy of x
        sums = np.add.accumulate(head if alpha == 1.0 else head**alpha, axis=1)
        sums += 1.0
        table[:, 2 : 2 + cols] = sums
    if 2 + cols <= max_width:
        table[:, 2 + cols :] = table[:, [1 + cols]]
    return table
