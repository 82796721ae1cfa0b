"""The engine's copy-proposal source: prompt lookup per request, offered to the scheduler.

Every admitted request whose proposal source (``GenerationRequest.proposal_source``, else
``EngineConfig.proposal_source``) is "copy" or "both" gets a
:class:`~helios_jax.runtime.lookup.PromptLookup` over its prompt. After each completion that
commits tokens of it, the engine calls :meth:`CopySource.committed`, which

  1. appends the committed tokens to the request's context (the pending token included: it is
     the token the next round verifies first, and the suffix the lookup matches ends with it);
  2. drafts up to D tokens by prompt lookup (D the deepest captured proposal depth);
  3. offers their count to the scheduler (``Scheduler.offer_copy``), which bounds the request's
     next round by it and, under "both", picks that round's source by the per-source estimates;
  4. stores the draft on the request's program inputs (``RequestInputs.copy``) for the executor
     to pack when the source is copy, ``None`` (learned proposals) otherwise.

The scheduler makes such a request's rounds wait for the completion of its previous round, so the
draft always continues exactly the context the device holds. Costs per round: one n-gram index
update per committed token and one lookup (``lookup.py``), on the host between frames.
"""

from __future__ import annotations

import dataclasses

from helios_jax.engine_config import PROPOSAL_SOURCES
from helios_jax.runtime.executor import RequestInputs
from helios_jax.runtime.lookup import DEFAULT_LOOKUP, LookupConfig, PromptLookup
from helios_jax.scheduler.core import Scheduler
from helios_jax.scheduler.plan import Handle
from helios_jax.scheduler.speculation import SOURCE_COPY


class CopySource:
    """Prompt-lookup drafts for the engine's requests (module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        source: str,
        depth: int,
        *,
        learned: bool = True,
        config: LookupConfig = DEFAULT_LOOKUP,
    ):
        """Args:
        scheduler: the engine's scheduler.
        source: ``EngineConfig.proposal_source``, the source of requests that name none.
        depth: the deepest captured D (0: the engine does not speculate).
        learned: the model has an MTP head (learned proposals exist).
        config: the lookup's match lengths.

        Raises ValueError when `source` needs learned proposals the model cannot draft.
        """
        self.scheduler = scheduler
        self.depth = depth
        self.learned_available = learned
        self.config = config
        self.default = self.resolve(source)
        self._lookups: dict[int, tuple[PromptLookup, bool]] = {}  # rid -> (lookup, learned allowed)

    def resolve(self, source: str | None) -> str:
        """A request's proposal source (None: the engine's); ValueError for one it cannot serve."""
        source = self.default if source is None else source
        if source not in PROPOSAL_SOURCES:
            raise ValueError(f"proposal_source must be one of {PROPOSAL_SOURCES}, got {source!r}")
        if source != "copy" and self.depth and not self.learned_available:
            raise ValueError(
                f"proposal_source={source!r} needs a model with an MTP draft head; this model "
                "speculates with copy proposals only"
            )
        return source

    def admit(self, handle: Handle, prompt: tuple[int, ...], source: str | None = None) -> None:
        """Index a newly admitted request's prompt when it copies (`source` None: the engine's);
        it drafts nothing before its first token."""
        source = self.resolve(source)
        if not self.depth or source == "learned":
            return
        for rid in [r for r in self._lookups if r not in self.scheduler.requests]:
            del self._lookups[rid]  # requests that ended without a final completion (cancelled)
        self._lookups[handle.rid] = (PromptLookup(prompt, self.config), source == "both")
        self.scheduler.offer_copy(handle, 0, learned=source == "both")

    def committed(self, handle: Handle, tokens, finished: bool, inputs: RequestInputs) -> RequestInputs:
        """A completion committed `tokens` of the request: its inputs for the next round, with
        the next draft as ``copy`` (``None`` when the next round's source is learned)."""
        entry = self._lookups.get(handle.rid)
        if entry is None:
            return inputs
        lookup, learned = entry
        lookup.extend(tokens)
        if finished:
            del self._lookups[handle.rid]
            return inputs
        draft = lookup.propose(self.depth)
        source = self.scheduler.offer_copy(handle, len(draft), learned=learned)
        copy = draft if source == SOURCE_COPY else None
        return inputs if inputs.copy == copy else dataclasses.replace(inputs, copy=copy)
