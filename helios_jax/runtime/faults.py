"""Contained faults: one request's failure ends that request alone (docs/engine.md, "Faults").

- submitting: a request the engine cannot run raises ValueError naming the field, before it
  changes anything (`SamplingParams` checks its own ranges);
- packing: the engine packs a plan's inputs before committing it; when packing raises, each lane
  is packed alone to find the requests at fault, which fail (all the plan's requests when every
  lane packs alone), and the scheduler plans again without them;
- completing: unreadable outputs fail the frame's requests and complete it empty; an error while
  publishing one request (detokenizing, stop strings, log-probabilities) fails that request;
- a failed program (its call raised, or its outputs carry an error): the donated device state is
  lost with every resident request's rows, so every resident request fails, the frames in flight
  complete empty, and the engine continues on a fresh state (`/health` is 503 only meanwhile).

- stalled: with nothing in flight, requests the scheduler could select but never plans for
  `STALL_LIMIT_S` fail with an error naming the stall, instead of waiting forever with their
  streams open (the scheduler's liveness is its own property, checked by its state machine;
  this guard turns a breach of it into a clear error).

Anything else the loop meets (a scheduler invariant) still stops the engine (`HeliosEngine._fail`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from helios_jax.catalog import GraphKind
from helios_jax.runtime.api import GenerationRequest, SamplingParams, StreamEvent
from helios_jax.runtime.state_copies import forget_stored
from helios_jax.scheduler.plan import CompletionRecord, ExecutionTiming
from helios_jax.scheduler.pricing import runnable
from helios_jax.scheduler.view import LaneRole

log = logging.getLogger("helios_jax.engine")
STALL_LIMIT_S = 30.0  # idle with selectable requests and no plan this long: fail them


class FaultContainment:
    """HeliosEngine's request checks and fault handling (a mixin over the engine's loop state)."""

    def _check_request(self, request: GenerationRequest) -> None:
        if not isinstance(request.sampling, SamplingParams):
            raise ValueError("sampling must be SamplingParams")
        prompt = request.prompt_tokens
        if not prompt:
            raise ValueError("prompt_tokens must hold at least one token")
        bad = next(
            (
                t
                for t in prompt
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size
            ),
            None,
        )
        if bad is not None:
            raise ValueError(f"prompt_tokens must be integers from 0 below {self.vocab_size}, got {bad!r}")
        if len(prompt) + request.sampling.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt)}) plus max_tokens "
                f"({request.sampling.max_tokens}) exceeds the context of {self.max_model_len}"
            )
        self._copies.resolve(request.proposal_source)  # a source the model can draft
        masked_decoding = (GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED)  # single-step
        if request.host_masked and not any(
            g.kind in masked_decoding and g.steps == 1 for g in self.scheduler.graphs.graphs
        ):  # a masked decoder rides no K-step program (a K-step program takes no token mask)
            raise ValueError(
                "structured output and multi-token bad words need a single-step decode program "
                "(--decode_steps with 1)"
            )
        if request.request_id in self._by_id:
            raise ValueError(f"request_id {request.request_id!r} is already in use")

    def _check_stall(self) -> None:
        """Called while the loop idles (nothing in flight, nothing planned): fails the requests
        the scheduler could select once they have gone unplanned for `stall_limit_s`."""
        stalled = [r for r in self.scheduler.requests.values() if runnable(r)]
        now = time.monotonic()
        if not stalled:
            self._stalled_since = None
            return
        if self._stalled_since is None:
            self._stalled_since = now
        if now - self._stalled_since < self.stall_limit_s:
            return
        self._stalled_since = None
        for req in stalled:
            log.error("no plan serves %s (%s, %s)", req.handle, req.phase, req.prerequisites)
            active = self._by_rid.get(req.rid)
            if active is not None:
                why = f"no prepared program served this request for {self.stall_limit_s:.0f} s"
                self._fail_request(active, why)

    def _wants_logprobs(self, plan) -> bool:
        return any(
            (a := self._by_rid.get(lane.handle.rid)) is not None and a.request.sampling.logprobs
            for lane in plan.lanes
        )

    def _pack(self, plan):
        """The plan's inputs, or None after failing the requests whose lanes cannot be packed
        (each lane is packed alone to find them; when every lane packs alone, all are blamed)."""
        try:
            return self.executor.pack(plan, self._inputs_of(plan), self._token_masks(plan))
        except Exception as e:
            log.exception("packing %s failed", plan.graph.name)
            culprits = []
            for lane in plan.lanes:
                alone = dataclasses.replace(plan, lanes=(lane,))
                try:
                    self.executor.pack(alone, self._inputs_of(plan), self._token_masks(alone))
                except Exception:
                    culprits.append(lane)
            for lane in culprits or plan.lanes:
                self._fail_request(self._by_rid[lane.handle.rid], f"packing {plan.graph.name} failed: {e}")
            return None

    def _fail_request(self, active, message: str) -> None:
        """End one request with an error; the scheduler frees its slot and pages after its
        last fence. Nothing else changes."""
        if active.done:
            return
        if active.handle is not None:
            try:
                self.scheduler.cancel(active.handle)
            except KeyError:
                pass
        active.done = True
        prompt = len(active.request.prompt_tokens)
        event = StreamEvent("", (), "error", prompt, active.completion_tokens, error=message)
        self._publisher.put(active.stream, event)
        self._by_id.pop(active.request.request_id, None)

    def _drop_frame(self, frame, message: str) -> None:
        """A frame whose outputs cannot be read: its requests fail, the frame completes empty."""
        for lane in frame.plan.lanes:
            active = self._by_rid.get(lane.handle.rid)
            if active is not None:
                self._fail_request(active, message)
        self._complete_empty(frame.plan, frame.fence)
        self.executor.inflight.remove(frame)

    def _complete_empty(self, plan, fence: int) -> None:
        """Completes a frame whose requests were all failed: placeholder records shaped as the
        plan requires (their tokens are dropped: the requests are cancelled), no cost sample."""
        records = [_placeholder(plan, lane) for lane in plan.lanes]
        self.scheduler.complete(fence, records, ExecutionTiming((0.0,), 0.0))

    def _device_failure(self, message: str, undispatched=None) -> None:
        """A program failed: the donated device state, and every resident request's rows in it,
        are lost. Those requests fail, the frames in flight complete empty (the scheduler frees
        their slots and pages), and the engine serves on a fresh state; waiting requests keep
        their place. `/health` reports 503 while this runs."""
        self._degraded = True
        try:
            for active in list(self._by_rid.values()):
                if active.handle is not None:
                    self._fail_request(active, f"engine failure: {message}")
            for frame in list(self.executor.inflight):
                self._complete_empty(frame.plan, frame.fence)
            if undispatched is not None:
                self._complete_empty(*undispatched)
            self.executor.reset(self._programs.init_state())
            forget_stored(self.scheduler.captures.checkpoints)  # the fresh state holds none
        finally:
            self._degraded = False


def _placeholder(plan, lane) -> CompletionRecord:
    """A record that passes the scheduler's validation of `lane` (scheduler.plan
    `validate_completion`) and commits nothing visible: only cancelled requests receive it."""
    if lane.role is LaneRole.PROMPT:
        tokens = (0,) if lane.finishes_prompt else ()
        return CompletionRecord(lane.handle, lane.epoch, prompt_tokens=lane.prompt_tokens, tokens=tokens)
    if lane.role is LaneRole.DECODE:
        offered = max(lane.query_length - 1, 0) if plan.graph.steps == 1 else 0
        return CompletionRecord(lane.handle, lane.epoch, tokens=(0,), offered=offered)
    return CompletionRecord(lane.handle, lane.epoch)
