"""Classic scheduling baselines on the real Scheduler lifecycle, for the simulator comparison.

Each baseline is a :class:`~helios_jax.scheduler.core.Scheduler` subclass: admission, KV and slot
reservations, the two-slot window, ``commit``/``complete`` validation, service accounting and
cost learning are the real ones; only *selection* (``plan()``) is replaced by a classic rule that
chooses among the loaded catalog's prepared programs. A baseline plan is frozen by the same
``Scheduler._freeze`` the utility scheduler uses, so ``commit`` checks it like any other plan.

Baselines (``token_budget`` counts the tokens an execution processes: prompt tokens consumed plus
decode target rows; a prepared program may pad up to its physical capacity):

- :class:`FcfsPrefillFirst` (vLLM-style continuous batching, prefill first): whenever a prompt is
  waiting, run the oldest waiting prompt's next chunk, ``min(remaining prompt, budget, largest
  prepared chunk)`` tokens on the smallest prepared prefill capacity that holds them; otherwise run
  one decode step for every decoding request on the smallest prepared width-one batch covering
  them (speculative catalogs: the width-one speculative programs).
- :class:`FcfsFixedWidth` (classic fixed-width speculation): the same, but every decode step runs
  the host-allocated speculative programs of one width ``W`` (each lane verifies ``min(W, output
  left)`` rows).
- :class:`StallFreeChunked` (Sarathi-Serve-style stall-free batching): every step serves all
  decoding requests at width one and fills the rest of the budget with at most one chunk of the
  oldest waiting prompt, on the smallest prepared mixed program whose capacities fit (``B - 1``
  decode rows, prompt capacity); with no fitting mixed program it alternates separate decode and
  prefill programs.

When more decoding requests are runnable than the largest prepared batch (or the budget) holds,
the least recently served ones go first (then the oldest), so no stream starves.

The baselines schedule prompts and decoding only: they reject prerequisites (``initialize``,
checkpoint restores, image windows, terminal snapshots), which the simulator does not use.

:func:`simulate` runs :func:`helios_jax.simulation.run` with any scheduler factory, and every
scheduler built through :func:`factory` records what it committed (``choices``).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable

from helios_jax import simulation
from helios_jax.catalog import Allocation, Catalog, DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler.core import Scheduler
from helios_jax.scheduler.plan import ExecutionClass, ScheduledPlan
from helios_jax.scheduler.view import Candidate, Lane, LaneRole, Phase, RequestView

BUDGETS = (256, 512, 1024, 2048, 4096)


# -- recording --------------------------------------------------------------------------------


class Recording:
    """Mixin: tallies every committed plan (program, prompt tokens, decode lanes and rows) and
    checks it with :func:`plan_violations` (baselines: against their token budget too)."""

    def _init_recording(self) -> None:
        self.violations = []  # what plan_violations found, per committed plan
        self.choices = collections.Counter()  # graph name -> committed plans
        self.kind_counts = collections.Counter()  # graph kind -> committed plans
        self.prompt_tokens_by_kind = collections.Counter()  # kind -> prompt tokens consumed
        self.decode_lanes_by_kind = collections.Counter()  # kind -> decode lanes served
        self.decode_rows_by_kind = collections.Counter()  # kind -> decode rows (query length or ceiling)
        self.expected_ms_by_kind = collections.Counter()  # kind -> expected execution ms

    def commit(self, plan: ScheduledPlan, fence: int) -> None:
        found = plan_violations(self, plan, getattr(self, "token_budget", None))  # type: ignore[arg-type]
        super().commit(plan, fence)  # type: ignore[misc]
        self.violations += found
        kind = plan.graph.kind.value
        prompt = sum(lane.prompt_tokens for lane in plan.lanes if lane.role is LaneRole.PROMPT)
        lanes = [lane for lane in plan.lanes if lane.role is LaneRole.DECODE]
        rows = sum(max(lane.query_length, lane.ceiling) for lane in lanes)
        self.choices[plan.graph.name] += 1
        self.kind_counts[kind] += 1
        self.prompt_tokens_by_kind[kind] += prompt
        self.decode_lanes_by_kind[kind] += len(lanes)
        self.decode_rows_by_kind[kind] += rows
        self.expected_ms_by_kind[kind] += plan.expected_duration_ms or 0.0

    def summary(self) -> dict:
        plans = sum(self.kind_counts.values())
        out = {"plans": plans, "by_kind": {}}
        for kind, n in sorted(self.kind_counts.items()):
            lanes = self.decode_lanes_by_kind[kind]
            out["by_kind"][kind] = {
                "plans": n,
                "share_of_time": self.expected_ms_by_kind[kind]
                / max(1e-9, sum(self.expected_ms_by_kind.values())),
                "mean_prompt_tokens": self.prompt_tokens_by_kind[kind] / n,
                "mean_decode_lanes": lanes / n,
                "mean_rows_per_decode_lane": self.decode_rows_by_kind[kind] / lanes if lanes else 0.0,
            }
        out["top_programs"] = dict(self.choices.most_common(8))
        out["violations"] = len(self.violations)
        return out


class RecordingScheduler(Recording, Scheduler):
    """The utility scheduler, unchanged, recording its committed plans."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_recording()


# -- the baselines ------------------------------------------------------------------------------


class BaselineScheduler(Recording, Scheduler):
    """A Scheduler whose selection is a classic rule; everything else is the real lifecycle.

    Subclasses implement :meth:`choose`, returning a :class:`Candidate` built from the loaded
    programs (``self.graphs``), or None.
    """

    def __init__(
        self,
        catalog: Catalog,
        *,
        token_budget: int,
        mode: DecodeMode | str | None = None,
        fixed_width: int | None = None,
        **kwargs,
    ):
        if token_budget < 1:
            raise ValueError(f"token_budget must be positive, got {token_budget}")
        for unsupported in ("initialize_requests", "checkpoints", "vision_window_tokens"):
            if kwargs.get(unsupported):
                raise ValueError(
                    f"{type(self).__name__} schedules prompts and decoding only: "
                    f"{unsupported} is not supported"
                )
        super().__init__(catalog, mode=mode, fixed_width=fixed_width, **kwargs)
        self._init_recording()
        self.token_budget = int(token_budget)
        graphs = self.graphs.graphs
        self.prefill_programs = sorted(
            (g for g in graphs if g.kind is GraphKind.PREFILL), key=lambda g: g.token_capacity
        )
        self.scored_programs = sorted(
            (g for g in graphs if g.kind is GraphKind.SCORED_PREFILL), key=lambda g: g.token_capacity
        )
        self.width_one = sorted(
            (
                g
                for g in graphs
                if g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE) and g.token_capacity == 1
            ),
            key=lambda g: g.batch_capacity,
        )
        self.mixed_width_one = [g for g in graphs if g.kind is GraphKind.MIXED and g.token_capacity == 1]
        self.last_kind: GraphKind | None = None

    # -- lifecycle hooks -------------------------------------------------------------------
    def admit(self, prompt, *, image_spans=(), **kwargs):
        if tuple(image_spans):
            raise ValueError(f"{type(self).__name__} does not schedule image windows")
        return super().admit(prompt, image_spans=image_spans, **kwargs)

    def commit(self, plan: ScheduledPlan, fence: int) -> None:
        super().commit(plan, fence)
        self.last_kind = plan.graph.kind

    def plan(self) -> ScheduledPlan | None:
        """The baseline's next program (pure, like ``Scheduler.plan``)."""
        if self._window_blocked():
            return None
        start = self._planning_start_ns()
        views = [v for v in self.views(start) if v.runnable]
        if not views:
            return None
        if any(v.phase in (Phase.BLOCKED, Phase.TERMINAL) for v in views):
            raise RuntimeError(f"{type(self).__name__} cannot schedule prerequisites or terminal snapshots")
        prompts = sorted((v for v in views if v.phase is Phase.PREFILL), key=lambda v: v.rid)
        decoders = [v for v in views if v.phase is Phase.DECODE]
        chosen = self.choose(prompts, decoders)
        if chosen is None:
            return None
        return self._freeze(chosen, ExecutionClass.ORDINARY, 0.0, start)

    def choose(self, prompts: list[RequestView], decoders: list[RequestView]) -> Candidate | None:
        raise NotImplementedError

    # -- building blocks -------------------------------------------------------------------
    def _candidate(self, g: GraphDescriptor, lanes: list[Lane]) -> Candidate:
        return Candidate(
            graph=g,
            lanes=tuple(lanes),
            duration_ms=self.costs.estimate_ms(g.key),
            score=0.0,
            useful_value=0.0,
            log_scale=0.0,
            stale=self.costs.is_stale(g.key, self.now_ns),
        )

    @staticmethod
    def _by_service(decoders: list[RequestView]) -> list[RequestView]:
        """Least recently served first, then the oldest."""
        return sorted(decoders, key=lambda v: (v.last_selected_ns, v.rid))

    @staticmethod
    def _expected(v: RequestView, rows: int) -> float:
        """Expected committed tokens of `rows` target rows under the request's acceptance means."""
        surv = list(v.survival[: max(0, rows - 1)])
        total, running = 1.0, 1.0
        for s in surv:
            running = min(running, float(s))
            total += running
        return total

    def _decode_lane(self, v: RequestView, rows: int) -> Lane:
        return Lane(
            v.rid, v.slot, LaneRole.DECODE, query_length=rows, expected_tokens=self._expected(v, rows)
        )

    @staticmethod
    def _prompt_lane(v: RequestView, tokens: int) -> Lane:
        return Lane(
            v.rid,
            v.slot,
            LaneRole.PROMPT,
            prompt_tokens=tokens,
            expected_tokens=1.0 if tokens == v.prompt_remaining else 0.0,
        )

    @staticmethod
    def _width(v: RequestView, width: int) -> int:
        """Target rows a lane may verify: program width, output left, context left (at least one)."""
        return max(1, min(width, v.output_remaining, v.context_remaining))

    def prefill(self, v: RequestView, budget: int) -> Candidate | None:
        """`v`'s next chunk: min(remaining, budget, largest chunk) tokens on the smallest capacity."""
        programs = self.scored_programs if v.needs_scores else self.prefill_programs
        if not programs or budget < 1:
            return None
        tokens = min(v.prompt_work(programs[-1].token_capacity), budget)
        for g in programs:
            n = min(v.prompt_work(g.token_capacity), tokens)
            if n == tokens and n > 0:
                return self._candidate(g, [self._prompt_lane(v, n)])
        return None

    def width_one_step(self, decoders: list[RequestView], budget: int) -> Candidate | None:
        """One width-one decode step for every decoder on the smallest batch covering them."""
        if not self.width_one or not decoders:
            return None
        cap = min(self.width_one[-1].batch_capacity, budget)
        chosen = self._by_service(decoders)[:cap]
        g = next((g for g in self.width_one if g.batch_capacity >= len(chosen)), self.width_one[-1])
        return self._candidate(g, [self._decode_lane(v, 1) for v in chosen])


class FcfsPrefillFirst(BaselineScheduler):
    """vLLM-style FCFS continuous batching, prefill first, with a token budget."""

    def choose(self, prompts, decoders):
        for v in prompts:  # the oldest waiting prompt first
            c = self.prefill(v, self.token_budget)
            if c is not None:
                return c
        return self.decode_step(decoders)

    def decode_step(self, decoders):
        return self.width_one_step(decoders, self.token_budget)


class FcfsFixedWidth(FcfsPrefillFirst):
    """FCFS prefill first whose decode steps all run host-allocated speculation at width W.

    It loads the catalog in fixed mode at width W, so the eligible speculative programs are
    exactly the host-allocated ones of that width.
    """

    def __init__(self, catalog: Catalog, *, token_budget: int, fixed_width: int, **kwargs):
        kwargs.pop("mode", None)
        super().__init__(
            catalog, token_budget=token_budget, mode=DecodeMode.FIXED, fixed_width=fixed_width, **kwargs
        )
        self.width = int(fixed_width)
        self.spec_programs = sorted(
            (
                g
                for g in self.graphs.graphs
                if g.kind is GraphKind.SPECULATIVE
                and g.allocation is Allocation.QUERY_LENGTH
                and g.token_capacity == self.width
            ),
            key=lambda g: (g.batch_capacity, g.target_capacity),
        )
        if not self.spec_programs:
            raise ValueError(f"no host-allocated speculative program of width {self.width}")

    def decode_step(self, decoders):
        if not decoders:
            return None
        order = self._by_service(decoders)
        widths = [self._width(v, self.width) for v in order]
        for g in self.spec_programs:  # the smallest program that serves every decoder
            if g.batch_capacity >= len(order) and sum(widths) <= min(g.target_capacity, self.token_budget):
                return self._candidate(g, [self._decode_lane(v, w) for v, w in zip(order, widths)])
        # Too many decoders: the largest program, filled in service order.
        g = max(self.spec_programs, key=lambda g: (g.batch_capacity, g.target_capacity))
        lanes, rows = [], 0
        limit = min(g.target_capacity, self.token_budget)
        for v, w in zip(order, widths):
            if len(lanes) < g.batch_capacity and rows + w <= limit:
                lanes.append(self._decode_lane(v, w))
                rows += w
        return self._candidate(g, lanes) if lanes else None


class StallFreeChunked(BaselineScheduler):
    """Sarathi-Serve-style stall-free chunked prefill with a token budget."""

    def choose(self, prompts, decoders):
        order = self._by_service(decoders)[: self.token_budget]
        left = self.token_budget - len(order)
        if not prompts:
            return self.width_one_step(order, self.token_budget)
        prompt = prompts[0]  # the oldest waiting prompt
        if not order:
            return self.prefill(prompt, self.token_budget)
        if left > 0 and not prompt.needs_scores:
            mixed = self.mixed(prompt, order, left)
            if mixed is not None:
                return mixed
        # No mixed program fits: alternate the separate programs (decode step, then the chunk).
        if self.last_kind is not None and self.last_kind.is_generation:
            chunk = self.prefill(prompt, max(left, 1))
            if chunk is not None:
                return chunk
        return self.width_one_step(order, self.token_budget)

    def mixed(self, prompt: RequestView, order: list[RequestView], left: int) -> Candidate | None:
        """The smallest mixed program holding every decoder and the prompt's chunk."""
        fits = []
        for g in self.mixed_width_one:
            if g.batch_capacity - 1 < len(order):
                continue
            largest = max(
                h.prefill_capacity for h in self.mixed_width_one if h.batch_capacity == g.batch_capacity
            )
            tokens = min(prompt.prompt_work(largest), left)
            n = min(prompt.prompt_work(g.prefill_capacity), tokens)
            if n != tokens or n < 1:
                continue
            t = self.costs.estimate_ms(g.key)
            fits.append(((math.inf if t is None else t, g.target_capacity, g.batch_capacity), g, n))
        if not fits:
            return None
        _, g, n = min(fits, key=lambda x: x[0])
        return self._candidate(g, [self._prompt_lane(prompt, n)] + [self._decode_lane(v, 1) for v in order])


# -- legality -------------------------------------------------------------------------------------


def plan_violations(sched: Scheduler, plan: ScheduledPlan, token_budget: int | None = None) -> list[str]:
    """What is wrong with `plan` for `sched` (empty: a legal plan of a loaded program).

    Checks the program is one of the loaded mode's eligible programs, the lanes fit its batch,
    width, target and prompt capacities, each request appears once, prompt chunks start at the
    request's cursor, and (when given) prompt tokens plus decode rows stay within `token_budget`.
    """
    g, lanes = plan.graph, plan.lanes
    out = []
    if not any(g is h or g == h for h in sched.graphs.graphs):
        out.append(f"{g.name} is not an eligible program of the loaded mode")
    rids = [lane.handle.rid for lane in lanes]
    if len(set(rids)) != len(rids):
        out.append(f"{g.name}: a request appears twice")
    if not lanes:
        out.append(f"{g.name}: no lanes")
    if len(lanes) > g.batch_capacity:
        out.append(f"{g.name}: {len(lanes)} lanes exceed B={g.batch_capacity}")
    prompt = [lane for lane in lanes if lane.role is LaneRole.PROMPT]
    decode = [lane for lane in lanes if lane.role is LaneRole.DECODE]
    if len(prompt) + len(decode) != len(lanes):
        out.append(f"{g.name}: lanes other than prompt and decode")
    for prompt_lane in prompt:
        req = sched.requests.get(prompt_lane.handle.rid)
        if (
            req is None
            or prompt_lane.prompt_start != req.consumed
            or prompt_lane.prompt_tokens < 1
            or prompt_lane.prompt_start + prompt_lane.prompt_tokens > req.prompt_len
        ):
            out.append(f"{g.name}: prompt lane {prompt_lane.handle} outside its prompt")
    rows = sum(max(lane.query_length, lane.ceiling) for lane in decode)
    if g.kind.is_prefill:
        if decode or len(prompt) != 1 or prompt[0].prompt_tokens > g.token_capacity:
            out.append(f"{g.name}: a prefill runs one chunk within its capacity")
    elif g.kind is GraphKind.MIXED:
        if len(prompt) > 1 or (prompt and prompt[0].prompt_tokens > g.prefill_capacity):
            out.append(f"{g.name}: at most one prompt row within the prompt capacity")
        if any(not 1 <= lane.query_length <= g.token_capacity for lane in decode):
            out.append(f"{g.name}: decode rows outside width {g.token_capacity}")
        if sum(lane.prompt_tokens for lane in prompt) + rows > g.target_capacity:
            out.append(f"{g.name}: packed extent exceeds {g.target_capacity}")
    elif g.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE):
        if prompt:
            out.append(f"{g.name}: a generation program takes no prompt rows")
        if any(
            not 1 <= max(lane.query_length, lane.ceiling) <= min(g.token_capacity, g.proposal_depth + 1)
            for lane in decode
        ):
            out.append(f"{g.name}: a lane exceeds width {g.token_capacity}")
        if g.allocation is not Allocation.PREFIX_LIMIT and rows > max(g.target_capacity, g.batch_capacity):
            out.append(f"{g.name}: {rows} target rows exceed P={g.target_capacity}")
    else:
        out.append(f"{g.name}: not a prompt or generation program")
    if token_budget is not None and sum(lane.prompt_tokens for lane in prompt) + rows > token_budget:
        out.append(
            f"{g.name}: {sum(lane.prompt_tokens for lane in prompt)} prompt tokens + {rows} rows exceed the "
            f"budget {token_budget}"
        )
    return out


# -- running them in the simulator ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SchedulerSpec:
    """One scheduler setting of the comparison."""

    label: str
    kind: str  # "utility", "fcfs", "sarathi", "fcfs_fixed"
    token_budget: int | None = None
    fixed_width: int | None = None
    policy: str = "balanced"  # utility only
    mode: str | None = None  # utility only: None (the catalog's), "fixed" or "adaptive"

    @property
    def family(self) -> str:
        """The label without its budget (the sweep groups settings by family)."""
        return self.label.split("@")[0]


def baseline_mode(catalog: Catalog) -> tuple[DecodeMode, int | None]:
    """Baselines decode at width one: ordinary catalogs in ordinary mode, speculative catalogs in
    fixed mode at width one (exactly the width-one speculative and mixed programs)."""
    if catalog.mode == "ordinary":
        return DecodeMode.ORDINARY, None
    return DecodeMode.FIXED, 1


def factory(spec: SchedulerSpec) -> Callable[..., Scheduler]:
    """A callable with ``Scheduler``'s signature that builds `spec`'s scheduler.

    The simulator passes the catalog, mode, policy, fixed width and context; baselines keep the
    catalog and context and choose their own mode.
    """

    def make(catalog: Catalog, *, mode=None, policy_config=None, fixed_width=None, **kwargs) -> Scheduler:
        if spec.kind == "utility":
            return RecordingScheduler(
                catalog, mode=mode, policy_config=policy_config, fixed_width=fixed_width, **kwargs
            )
        if spec.kind == "fcfs_fixed":
            return FcfsFixedWidth(
                catalog, token_budget=spec.token_budget, fixed_width=spec.fixed_width, **kwargs
            )
        cls = {"fcfs": FcfsPrefillFirst, "sarathi": StallFreeChunked}[spec.kind]
        base_mode, width = baseline_mode(catalog)
        return cls(catalog, token_budget=spec.token_budget, mode=base_mode, fixed_width=width, **kwargs)

    return make


def simulate(
    config: simulation.SimConfig, make: Callable[..., Scheduler]
) -> tuple[simulation.SimResult, Scheduler]:
    """Run the simulator with the scheduler `make` builds; returns the result and the scheduler."""
    built = []

    def recording_make(*args, **kwargs):
        sched = make(*args, **kwargs)
        built.append(sched)
        return sched

    result = simulation.run(config, scheduler_factory=recording_make)
    return result, built[0]
