"""The engine: one background loop joining the scheduler, the prepared programs and the server.

A request's life here (numbers match ARCHITECTURE.md, "A request's life"):

1. ``submit`` (any thread) queues a :class:`GenerationRequest` and returns its stream.
2. The loop admits waiting requests in arrival order while a request slot and the KV pages of
   their whole execution ceiling are free (the scheduler reserves them). Every request starts
   with an ``initialize`` program that loads its sampling settings into its state row, or with a
   ``restore`` of a stored checkpoint its prompt extends (``runtime/state_copies.py``). A head of
   the queue refused long enough preempts a decoding request (``runtime/preemption.py``).
3. ``advance_to(now)``, ``plan()``, ``commit(plan, fence)``, then the executor packs the frame's
   inputs and dispatches the prepared program. Up to two frames are in flight: ordinary decode
   and complete speculative generation may be queued behind another; everything else, and every
   plan that needs completion feedback, waits for an empty window.
4. The loop observes completion itself, oldest frame first (no thread per frame): it waits on the
   oldest frame when it has no host work left and polls between host tasks (the executor's
   module docstring says how device intervals stay free of host time). It turns the outputs into
   completion records, calls the scheduler's completion (the packed-round and survival variants
   where the program produced a sidecar or survival rows), detokenizes incrementally, applies
   stop strings, and reports each visible burst with ``published_output`` before the next
   completion is processed; the frame's events go onto their streams together when its
   completion ends (``runtime/publishing.py``).
5. Finished, stopped and cancelled requests end their streams; the scheduler returns their slot
   and pages after their last submitted fence.

The loop thread is the only one touching the scheduler and the device state.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np

from helios_jax.catalog import GraphKind
from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.engine_config import EngineConfig
from helios_jax.engine_options import EngineOptions
from helios_jax.prepare import load_engine_model, prepare, warm_up
from helios_jax.programs.inputs import STOP_CAPACITY
from helios_jax.runtime import api
from helios_jax.runtime.api import GenerationRequest, RequestStream, StreamEvent, program_seed
from helios_jax.runtime.copying import CopySource
from helios_jax.runtime.detokenize import TextStream
from helios_jax.runtime.executor import Dispatch, Executor, RequestInputs, completion_records, survival_rows
from helios_jax.runtime.faults import STALL_LIMIT_S, FaultContainment
from helios_jax.runtime.grammar import Grammars, RequestGrammar
from helios_jax.runtime.invariants import verify_pool
from helios_jax.runtime.logprobs import PromptScores, lane_logprobs
from helios_jax.runtime.preemption import Preemptions, continuation
from helios_jax.runtime.publishing import Publisher, burst
from helios_jax.runtime.sampling_controls import processor_settings
from helios_jax.runtime.scheduling import build_scheduler, check_measure_runs, measure_into
from helios_jax.runtime.state_copies import CheckpointStats, StateCopies
from helios_jax.runtime.token_masks import frame_token_masks
from helios_jax.runtime.tokenizer import HFTokenizer
from helios_jax.scheduler.config import PolicyConfig

log = logging.getLogger("helios_jax.engine")


@dataclasses.dataclass
class _Active:
    request: GenerationRequest
    stream: RequestStream
    text: TextStream
    handle: object = None
    inputs: RequestInputs | None = None
    completion_tokens: int = 0
    prompt_scores: PromptScores | None = None
    done: bool = False
    output: list[int] = dataclasses.field(default_factory=list)  # every token produced so far
    admission: GenerationRequest | None = None  # a preempted request's continuation, once queued
    queued_ns: int = 0  # when it joined the admission queue (the preemption delay counts from here)
    queue_s: float | None = None  # submission to first admission (seconds), until its first event reports it
    grammar: RequestGrammar | None = None  # structured output: the matcher over its output


class HeliosEngine(FaultContainment):
    """Serves one model with one prepared catalog (``helios_jax.runtime.api.Engine``).

    `measure_runs` > 0 times every program that many times before serving and seeds the duration
    estimates with those isolated samples (docs/engine.md, "Measured start-up"); 0 leaves each
    program to be measured on its first use.
    """

    def __init__(
        self,
        *,
        model_config,
        params,
        tokenizer: HFTokenizer,
        engine_config: EngineConfig,
        policy_config: PolicyConfig | None = None,
        model_name: str = "helios-default",
        programs=None,
        progress: Callable[[str], None] | None = None,
        start: bool = True,
        check_invariants: bool = False,
        measure_runs: int = 0,
    ):
        check_measure_runs(measure_runs)
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.config = engine_config
        self.catalog = engine_config.catalog(model_name)
        self.scheduler = build_scheduler(self.catalog, engine_config, policy_config)
        # The scheduler's context leaves room for the draft storage a speculative round writes.
        self.max_model_len = self.scheduler.max_model_len
        self.checkpoint_stats = CheckpointStats()
        self.preemptions = Preemptions(self.scheduler)
        draft = max(engine_config.proposal_depths, default=0) if engine_config.speculative else 0
        has_mtp = model_config is None or model_config.has_mtp
        self._copies = CopySource(self.scheduler, engine_config.proposal_source, draft, learned=has_mtp)
        if programs is None:
            prepared = prepare(model_config, params, engine_config, name=model_name, progress=progress)
            programs, params = prepared.programs, prepared.params
            if not measure_runs:  # a measurement's first run of each program is its warm-up
                warm_up(programs, params, progress)
        if measure_runs:
            measure_into(self.scheduler, programs, params, measure_runs, self._now(), progress)
        # Token ids the programs accept: the model's vocabulary (engines over fake programs,
        # built without a model, take the tokenizer's).
        self.vocab_size = model_config.vocab_size if model_config is not None else tokenizer.vocab_size
        self._programs = programs
        # Structured output: compiled in the server's parsing threads, matched on the loop.
        self.grammars = Grammars(tokenizer, self.vocab_size, tokenizer.eos_token_ids)
        copies = StateCopies(engine_config, self.scheduler.captures.checkpoints)
        self.executor = Executor(programs, params, programs.init_state(), copies=copies.pack)
        self._degraded = False  # rebuilding the device state after a failed program
        self.stall_limit_s, self._stalled_since = STALL_LIMIT_S, None  # faults.py
        self._events: queue.Queue = queue.Queue()
        self._publisher = Publisher()
        self._waiting: list[_Active] = []
        self._by_id: dict[str, _Active] = {}
        self._by_rid: dict[int, _Active] = {}
        self._fence = 0
        self._seed = int.from_bytes(os.urandom(4), "little")
        self._failed: str | None = None
        self.check_invariants = check_invariants  # tests: verify the page pool after every step
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="helios-engine", daemon=True)
        if start:
            self.start()

    # == the Engine interface =================================================================
    def start(self) -> None:
        self._thread.start()
        self._ready.set()

    def ready(self) -> bool:
        return (
            self._ready.is_set() and self._failed is None and not self._stop.is_set() and not self._degraded
        )

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a request; raises ValueError (naming the field) for one the engine cannot run,
        before it changes anything. `SamplingParams` validated its own ranges."""
        self._check_request(request)
        api.check_stop_ids(request.sampling, self.tokenizer.eos_token_ids, self.vocab_size, STOP_CAPACITY)
        stream = RequestStream(
            request.request_id, cancel_callback=lambda rid: self._events.put(("cancel", rid))
        )
        if self._failed is not None:
            stream.put(StreamEvent("", (), finish_reason="error", error=self._failed))
            return stream
        s = request.sampling
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=s.skip_special_tokens)
        active = _Active(request, stream, TextStream(decode, s.stop, s.include_stop_str_in_output))
        self._events.put(("submit", active))
        return stream

    def metrics_text(self) -> str:
        from helios_jax.serve.engine_metrics import render_engine

        return render_engine(self)

    @property
    def waiting(self) -> int:
        """Requests queued for admission (preempted ones awaiting their continuation included)."""
        return len(self._waiting)

    def shutdown(self) -> None:
        self._stop.set()
        self._events.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # == the loop ===============================================================================
    def _now(self) -> int:
        return time.perf_counter_ns()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_events(block=False)
                if self._stop.is_set():
                    break
                self._step()
                if self.executor.inflight:
                    # Nothing more to dispatch now: wait on the oldest frame, then complete every
                    # frame already done (a later frame never completes first).
                    self.executor.wait_oldest()
                    self._complete_ready()
                else:
                    self._check_stall()
                    self._drain_events(block=True)  # idle: sleep until a submission arrives
            except Exception as e:  # a broken frame or program: fail everything, stop serving
                log.exception("engine loop failed")
                self._fail(f"engine failure: {e}")

    def _drain_events(self, *, block: bool) -> None:
        """Handle every queued submission and cancellation; with `block`, first wait for one
        (nothing is in flight and nothing could be dispatched)."""
        try:
            if block:
                timeout = 0.05 if (self._waiting or self.scheduler.requests) else 1.0
                self._handle(self._events.get(timeout=timeout))
            while True:
                self._handle(self._events.get_nowait())
        except queue.Empty:
            pass

    def _handle(self, event) -> None:
        kind, payload = event
        if kind == "submit":
            self._by_id[payload.request.request_id] = payload
            payload.queued_ns = self._now()
            self._waiting.append(payload)
        elif kind == "cancel":
            self._cancel(payload)

    def _step(self) -> None:
        self.executor.poll()
        self._admit()
        self.scheduler.advance_to(self._now())
        while len(self.executor.inflight) < 2:
            plan = self.scheduler.plan()
            if plan is None or (plan.needs_empty_window and self.executor.inflight):
                break
            inputs = self._pack(plan)
            if inputs is None:
                continue  # the requests whose lanes failed to pack were failed: plan again
            self._fence += 1
            self.scheduler.commit(plan, self._fence)
            try:
                self.executor.dispatch(plan, self._fence, self._inputs_of(plan), inputs=inputs)
            except Exception as e:  # the program call itself: the donated state is lost
                log.exception("dispatch failed")
                self._device_failure(f"{plan.graph.name} failed: {e}", (plan, self._fence))
                return
            self.executor.poll()
        if self.check_invariants:
            self._verify_pool()

    def _verify_pool(self) -> None:
        verify_pool(self.scheduler, self.executor, lambda rid: getattr(self._by_rid.get(rid), "inputs", None))

    def _inputs_of(self, plan):
        return {lane.handle.rid: self._by_rid[lane.handle.rid].inputs for lane in plan.lanes}

    def _token_masks(self, plan) -> dict:
        return frame_token_masks(plan, self._by_rid, self.vocab_size)  # lane index -> allowed tokens

    def _admit(self) -> None:
        while self._waiting:
            active = self._waiting[0]
            req = active.admission or active.request
            if not self.scheduler.can_admit(len(req.prompt_tokens), req.sampling.max_tokens):
                self._consider_preemption(active, req)
                return
            self._waiting.pop(0)
            s = req.sampling
            stops = api.request_stop_ids(s, self.tokenizer.eos_token_ids)
            try:
                handle = self.scheduler.admit(
                    req.prompt_tokens,
                    max_output=s.max_tokens,
                    message_endpoints=req.message_endpoints,
                    stop_token_ids=stops,
                    needs_scores=s.prompt_logprobs,
                    host_stops=bool(s.stop) or req.host_masked,  # host masks need feedback
                    sampling=s,
                    width_limit=1 if req.host_masked else None,  # the mask binds one row
                    host_mask=req.host_masked,  # no K-step lanes (they take no mask)
                )
            except ValueError as e:  # a request no program can serve: it alone fails
                self._fail_request(active, f"not admitted: {e}")
                continue
            seed = program_seed(s.seed) if s.seed is not None else (self._seed + handle.rid) % (1 << 31)
            active.queue_s = active.queue_s if active.handle else (self._now() - active.queued_ns) / 1e9
            active.handle = handle
            if req.grammar is not None and active.grammar is None:  # a continuation keeps its own
                active.grammar = req.grammar.start()
            self._copies.admit(handle, tuple(req.prompt_tokens), req.proposal_source)
            active.inputs = RequestInputs(
                tuple(req.prompt_tokens),
                tuple(self.scheduler.page_table(handle)),
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k if s.top_k < self.vocab_size else 0,  # k >= V keeps every token: off
                seed=seed,
                coupled=s.seed is not None,  # seeded text must not depend on speculation
                stop_tokens=stops,
                logprobs=s.logprobs or s.top_logprobs > 0,  # gates the programs' scoring
                processors=processor_settings(req, stops),
            )
            if s.prompt_logprobs:
                active.prompt_scores = PromptScores(len(req.prompt_tokens), s.top_logprobs)
            self._by_rid[handle.rid] = active

    def _consider_preemption(self, active: _Active, request: GenerationRequest) -> None:
        """Preempt for the refused head of the queue (``runtime/preemption.py``); a victim whose
        state is not captured continues at once, a captured one when its capture completes."""
        victim, capturing = self.preemptions.consider(request, (self._now() - active.queued_ns) / 1e6)
        if victim is not None:
            self.checkpoint_stats.preemptions += 1
            if not capturing:
                self._resume(self._by_rid[victim.rid])

    def _resume(self, active: _Active) -> None:
        """A preempted request continues as a new admission, behind the requests waiting now."""
        request = continuation(active.request, active.output)
        if request is None:
            self._finish(active, "length")
            return
        active.admission, active.queued_ns = request, self._now()
        self.checkpoint_stats.continuations += 1
        self._waiting.append(active)

    def _cancel(self, request_id: str) -> None:
        active = self._by_id.pop(request_id, None)
        if active is None or active.done:
            return
        if active in self._waiting:
            self._waiting.remove(active)
        elif active.handle is not None:
            try:
                self.scheduler.cancel(active.handle)
            except KeyError:
                pass
        self._finish(active, "cancelled")

    # == completions ============================================================================
    def _complete_ready(self) -> None:
        """Process completed frames in fence order (a later frame never completes first)."""
        while self.executor.inflight and self.executor.inflight[0].done:
            self._complete(self.executor.inflight[0])
            self.executor.poll()

    def _complete(self, frame: Dispatch) -> None:
        with self._publisher.frame():  # the frame's events go out together (publishing.py)
            self._complete_frame(frame)

    def _complete_frame(self, frame: Dispatch) -> None:
        if frame.error is not None:
            self._device_failure(f"fence {frame.fence} ({frame.plan.graph.name}) failed: {frame.error}")
            return
        plan = frame.plan
        self.scheduler.advance_to(self._now())
        outputs = frame.outputs
        try:  # validate every lane before any update: unreadable outputs fail this frame only
            records = completion_records(plan, outputs)
            scores = lane_logprobs(plan, outputs) if self._wants_logprobs(plan) else {}
        except Exception as e:
            log.exception("completion of fence %d failed", frame.fence)
            self._drop_frame(frame, f"completion of {plan.graph.name} failed: {e}")
            return
        timing = frame.timing()
        graph = plan.graph
        self.checkpoint_stats.observe(plan, self.scheduler.captures.checkpoints)
        depth = graph.proposal_depth if graph.kind in (GraphKind.SPECULATIVE, GraphKind.MIXED) else 0
        if depth > 0:
            sidecar = np.asarray(outputs.sidecar)
            survival = survival_rows(plan, outputs, self.catalog.request_slots, depth)
            generated = self.scheduler.complete_packed_round_with_survival(
                frame.fence, records, timing, sidecar, survival
            )
        else:
            generated = self.scheduler.complete(frame.fence, records, timing)
        self.executor.retire(frame)
        if self.check_invariants:
            self._verify_pool()
        if graph.kind is GraphKind.SCORED_PREFILL:
            self._collect_prompt_logprobs(plan, outputs)
        for g in generated:
            active = self._by_rid.get(g.handle.rid)
            if active is None or active.done:
                continue
            try:
                self._publish(active, g, frame.fence, scores.get(g.handle.rid))
                active.inputs = self._copies.committed(g.handle, g.tokens, active.done, active.inputs)
            except Exception as e:  # detokenizing, stop strings, scores: this request alone
                log.exception("publishing %s failed", active.request.request_id)
                self._fail_request(active, f"completion failed: {e}")

    def _collect_prompt_logprobs(self, plan, outputs) -> None:
        lane = plan.lanes[0]
        active = self._by_rid.get(lane.handle.rid)
        if active is None or active.prompt_scores is None or outputs.prompt_logprobs is None:
            return
        active.prompt_scores.collect(lane.prompt_start, lane.prompt_tokens, outputs)

    def _publish(self, active: _Active, generated, fence: int, scores=None) -> None:
        if generated.finish_reason == "preempted":  # its terminal capture completed: no tokens
            self._resume(active)  # the continuation restores it; the text stream stays open
            return
        event, ended = burst(active, generated, scores)
        if event is not None:
            # A visible burst (or tokens swallowed by a stop string) is reported before the
            # next completion is processed; an entirely buffered burst publishes nothing.
            if event.text:
                self.scheduler.published_output(active.handle, fence)
            self._publisher.put(active.stream, event)
        if (active.text.stopped or ended) and not generated.finished:
            self.scheduler.finish(active.handle, "stop")  # a host stop string, or the grammar's end
            self._finish(active, "stop")
        elif generated.finished:
            reason = generated.finish_reason or "stop"
            self._finish(active, "stop" if active.text.stopped else reason)

    def _finish(self, active: _Active, reason: str) -> None:
        active.done = True
        event = StreamEvent("", (), reason, len(active.request.prompt_tokens), active.completion_tokens)
        self._publisher.put(active.stream, event)
        self._by_id.pop(active.request.request_id, None)

    def _fail(self, message: str) -> None:
        self._failed = message
        for active in list(self._by_id.values()):
            if not active.done:
                active.done = True
                active.stream.put(
                    StreamEvent(
                        "",
                        (),
                        "error",
                        len(active.request.prompt_tokens),
                        active.completion_tokens,
                        error=message,
                    )
                )
        self._by_id.clear()
        self._waiting.clear()
        self._stop.set()


def build_real_engine(options: EngineOptions, progress: Callable[[str], None] | None = print) -> HeliosEngine:
    """The real engine for the engine flags (``python -m helios_jax.serve``'s default factory).

    Loads the model (`helios_jax.prepare.load_engine_model`: ``--model`` or the embedded one, in
    ``--dtype`` or float32 on a CPU), resolves the flags against it (`EngineOptions.engine_config`),
    and prepares the programs with the persistent compilation cache on, so restarts reuse them.

    Raises:
      ValueError: the model folder has no ``tokenizer.json``, or the flags do not fit the model.
    """
    enable_compilation_cache()
    if progress:
        progress(f"loading model from {options.model or 'the embedded default model'}")
    model = load_engine_model(options.model, dtype=options.dtype, tensor_parallel=options.tensor_parallel)
    if model.tokenizer is None:
        raise ValueError(f"{options.model} has no tokenizer.json")
    name = os.path.basename(os.path.normpath(options.model)) if options.model else "helios-default"
    return HeliosEngine(
        model_config=model.config,
        params=model.params,
        tokenizer=HFTokenizer.from_model(model),
        engine_config=options.engine_config(model.config),
        policy_config=options.policy_config(),
        model_name=name,
        progress=progress,
        measure_runs=options.measure_runs,
    )


def build_engine(options: EngineOptions, progress: Callable[[str], None] | None = print) -> HeliosEngine:
    """Deprecated name of :func:`build_real_engine`."""
    warnings.warn(
        "helios_jax.runtime.engine.build_engine is deprecated: use build_real_engine",
        DeprecationWarning,
        stacklevel=2,
    )
    return build_real_engine(options, progress)
