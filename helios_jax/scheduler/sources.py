"""Proposal sources: which source drafts a request's next round, and how far a copy reaches.

The spec has two proposal sources, learned (MTP) proposals and copy proposals, and "each request
tracks acceptance by source" (``speculation.AcceptanceHistory``). Copy proposals come from the
host (``runtime/lookup.py`` drafts them from the request's own context), so the host tells the
scheduler, before each round, how long a prefix it can supply: :meth:`ProposalSources.offer_copy`.
From then on:

- the request's rounds give it at most that prefix plus the pending token as target rows
  (``RequestView.copy_limit``: for copy proposals D bounds the supplied prefix, and a round
  verifies nothing that was not supplied);
- its rounds need completion feedback (``Request.needs_feedback``): the prefix is drafted from
  the tokens the previous round committed, which only its completion reveals, so no round of it
  is queued behind another of its rounds;
- when learned proposals are also allowed (``learned=True``), the source of the next round is
  chosen by its expected output under the request's own per-source estimates, read as the
  spec's bounded optimistic estimate min(1, mean + sqrt(ln 20 / (2 w))) (pooled like selection
  reads them): copy when ``1 + sum(u_copy[:k]) >= 1 + sum(u_learned[:D])`` for the offered
  prefix of k tokens, learned otherwise (docs/spec/RESOLUTIONS.md, 33). Ties go to copy, which
  draws nothing. The optimism is what lets a source that has fallen behind, or never been
  tried, be tried again: with the plain means, a request whose first rounds happened to be
  learned would never observe its copies (measured: no copy round at all on the repetitive
  benchmark of docs/copy-proposals.md), and aging weights bring an idle source's bonus back.

A request changes source only between rounds (the engine offers after each completion, when no
round of the request is in flight), so each round's acceptance is observed under the source that
drafted it.
"""

from __future__ import annotations

from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.learning import Population
from helios_jax.scheduler.plan import Handle
from helios_jax.scheduler.requests import Request
from helios_jax.scheduler.residents import Residents
from helios_jax.scheduler.speculation import SOURCE_COPY, SOURCE_LEARNED, expected_output


def choose_source(req: Request, population: Population, length: int, depth: int, alpha: float) -> str:
    """The source whose optimistic estimate promises more output next round (ties: copy);
    module docstring."""
    if length <= 0:
        return SOURCE_LEARNED
    pools, tokens = population.acceptance_pools, len(req.output)
    copy = req.acceptance.get(SOURCE_COPY).optimistic(tokens, pools[SOURCE_COPY])
    learned = req.acceptance.get(SOURCE_LEARNED).optimistic(tokens, pools[SOURCE_LEARNED])
    gain_copy = expected_output(copy, min(length, depth) + 1, alpha)
    gain_learned = expected_output(learned, depth + 1, alpha)
    return SOURCE_COPY if gain_copy >= gain_learned else SOURCE_LEARNED


class ProposalSources:
    """``Scheduler.offer_copy`` (a mixin; ``core.Scheduler`` sets the attributes below)."""

    residents: Residents
    population: Population
    policy: PolicyConfig

    def offer_copy(self, handle: Handle, length: int, *, learned: bool = False) -> str:
        """The host can supply a copy prefix of `length` tokens for the request's next round.

        Args:
          handle: a resident request with no round in flight.
          length: copied tokens available (0: none this round); bounded by the deepest D.
          learned: learned proposals are allowed too; the source is then chosen by
            :func:`choose_source`, else it is copy.
        Returns:
          The source of the request's next round.
        Raises:
          ValueError: a negative length, or a round of the request still in flight.
        """
        req = self.residents.lookup(handle)
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"a copy prefix length is a nonnegative integer, got {length!r}")
        if req.inflight:
            raise ValueError(f"{handle} has rounds in flight: offer copies after their completion")
        depth = self.population.depth
        source = SOURCE_COPY
        if learned:
            alpha = self.policy.adaptive_verification_alpha
            source = choose_source(req, self.population, length, depth, alpha)
        req.proposal_source = source
        req.copy_limit = min(length, depth)
        return source
