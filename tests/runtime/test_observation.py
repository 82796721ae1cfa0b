"""How the executor observes completion without a thread per frame, and which intervals it
reports: a stamp taken after host work ran past a frame's end carries host time and is reported
as a missing device interval (spec: host dispatch, completion delivery and polling time never
enter a graph's cost; missing intervals neither change an estimate nor make it fresh)."""

import threading
from types import SimpleNamespace

import pytest

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.runtime.executor import STAMP_TOLERANCE_NS, Executor

spec = pytest.mark.spec
US = 1_000


class Clock:
    def __init__(self):
        self.ns = 0

    def __call__(self):
        return self.ns


class ScriptedProgram:
    """A program whose frames finish at clock times the test sets; `wait` jumps the clock there."""

    def __init__(self, clock, call_ns=100 * US):
        self.clock, self.call_ns = clock, call_ns

    def pack(self, **_):
        return None

    def __call__(self, params, state, inputs):
        self.clock.ns += self.call_ns  # the call's own host work
        return state, SimpleNamespace(finish_ns=None)

    def is_ready(self, outputs):
        return outputs.finish_ns is not None and self.clock.ns >= outputs.finish_ns

    def wait(self, outputs):
        self.clock.ns = max(self.clock.ns, outputs.finish_ns)


DECODE = GraphDescriptor(GraphKind.DECODE, 1)


def executor(clock):
    program = ScriptedProgram(clock)
    return Executor({DECODE.key: program}, None, None, clock=clock), program


def dispatch(ex, fence):
    plan = SimpleNamespace(graph=DECODE, lanes=())  # pack_inputs reads only these
    frame = ex.dispatch(plan, fence, {})
    return frame


def test_the_loop_observes_frames_without_starting_threads():
    clock = Clock()
    ex, _ = executor(clock)
    before = threading.active_count()
    frame = dispatch(ex, 1)
    frame.outputs.finish_ns = clock.ns + 500 * US
    assert ex.poll() == 0
    ex.wait_oldest()
    assert threading.active_count() == before and frame.done


@spec("duration-estimates/no-host-time")
def test_an_isolated_frame_waited_on_reports_its_interval_from_the_call():
    clock = Clock()
    ex, _ = executor(clock)
    clock.ns = 5_000 * US
    frame = dispatch(ex, 1)  # the call: 100 us of host work, inside (the program may run in it)
    frame.outputs.finish_ns = clock.ns + 700 * US
    ex.wait_oldest()
    t = frame.timing()
    assert t.device_intervals_ns == (800 * US,)
    assert t.wall_ns == 800 * US


@spec("duration-estimates/no-host-time", "duration-estimates/missing-zero-ignored")
def test_a_frame_found_finished_after_host_work_reports_no_interval():
    clock = Clock()
    ex, _ = executor(clock)
    frame = dispatch(ex, 1)
    frame.outputs.finish_ns = clock.ns + 700 * US
    clock.ns += 2_000 * US  # host work (completion, planning) ran past the frame's end
    ex.wait_oldest()
    assert frame.timing().device_intervals_ns == (0.0,)
    assert ex.observations["late"] == 1


def test_device_time_per_program_averages_over_its_timed_executions():
    """graph_ns sums the device intervals; graph_timed counts the executions that had one, so a
    frame without an interval neither adds time nor dilutes the mean (graph_counts counts all)."""
    clock = Clock()
    ex, _ = executor(clock)
    timed = dispatch(ex, 1)
    timed.outputs.finish_ns = clock.ns + 700 * US
    ex.wait_oldest()
    ex.retire(timed)
    late = dispatch(ex, 2)
    late.outputs.finish_ns = clock.ns + 700 * US
    clock.ns += 2_000 * US  # found finished after host work: no interval
    ex.wait_oldest()
    ex.retire(late)
    name = DECODE.name
    assert ex.graph_counts[name] == 2 and ex.graph_timed[name] == 1
    assert ex.graph_ns[name] / ex.graph_timed[name] == 800 * US


@spec("duration-estimates/no-host-time")
def test_a_poll_close_to_the_end_keeps_the_interval():
    clock = Clock()
    ex, _ = executor(clock)
    frame = dispatch(ex, 1)
    frame.outputs.finish_ns = clock.ns + 700 * US
    clock.ns += 690 * US
    assert ex.poll() == 0  # seen pending 10 us before the end
    clock.ns += STAMP_TOLERANCE_NS // 2
    assert ex.poll() == 1
    assert frame.timing().device_intervals_ns == (100 * US + 690 * US + STAMP_TOLERANCE_NS // 2,)


@spec("service-accounting/queued-interval", "duration-estimates/isolated-and-queued")
def test_a_queued_frame_starts_at_its_predecessors_stamp_and_inherits_its_window():
    clock = Clock()
    ex, _ = executor(clock)
    first = dispatch(ex, 1)
    second = dispatch(ex, 2)
    first.outputs.finish_ns = clock.ns + 500 * US
    second.outputs.finish_ns = first.outputs.finish_ns + 300 * US
    ex.wait_oldest()
    ex.retire(first)
    ex.wait_oldest()
    t = second.timing()
    assert t.queued and t.device_intervals_ns == (300 * US,)
    # The same pair with the predecessor found late: the successor's start is that late stamp.
    clock2 = Clock()
    ex2, _ = executor(clock2)
    a, b = dispatch(ex2, 1), dispatch(ex2, 2)
    a.outputs.finish_ns = clock2.ns + 500 * US
    b.outputs.finish_ns = a.outputs.finish_ns + 300 * US
    clock2.ns = a.outputs.finish_ns + 200 * US  # host work past a's end
    ex2.wait_oldest()
    ex2.retire(a)
    ex2.wait_oldest()
    assert a.timing().device_intervals_ns == (0.0,)
    assert b.timing().device_intervals_ns == (0.0,)


class CountingProgram(ScriptedProgram):
    def __init__(self, clock):
        super().__init__(clock)
        self.packs = 0

    def pack(self, **host):
        self.packs += 1
        return host


def lane(rid, slot, query_length=0):
    return SimpleNamespace(handle=SimpleNamespace(rid=rid), slot=slot, query_length=query_length, ceiling=0)


def test_a_steady_batch_reuses_its_packed_inputs_and_any_change_repacks():
    from helios_jax.runtime.executor import PACKED_PER_PROGRAM, RequestInputs

    clock = Clock()
    program = CountingProgram(clock)
    ex = Executor({DECODE.key: program}, None, None, clock=clock)
    info = {1: RequestInputs((5,), (0, 1)), 2: RequestInputs((5,), (2, 3))}

    def run(lanes, info):
        frame = ex.dispatch(SimpleNamespace(graph=DECODE, lanes=tuple(lanes)), 1, info)
        frame.outputs.finish_ns = clock.ns
        ex.wait_oldest()
        ex.retire(frame)

    run([lane(1, 0), lane(2, 1)], info)
    run([lane(1, 0), lane(2, 1)], info)
    assert program.packs == 1
    run([lane(1, 0)], info)  # a lane left
    assert program.packs == 2
    run([lane(1, 0), lane(2, 1)], info)  # groups taking turns: each keeps its packed inputs
    run([lane(1, 0)], info)
    assert program.packs == 2
    run([lane(1, 0), lane(2, 3)], info)  # another slot
    assert program.packs == 3
    info = {**info, 2: RequestInputs((5,), (4, 5))}
    run([lane(1, 0), lane(2, 3)], info)  # new pages
    run([lane(1, 0), lane(2, 3, query_length=2)], info)  # another query length
    assert program.packs == 5
    equal = {**info, 2: RequestInputs((5,), (4, 5))}  # equal but another request's inputs
    run([lane(1, 0), lane(2, 3)], equal)
    assert program.packs == 6
    for slot in range(4, 4 + PACKED_PER_PROGRAM):  # the oldest lane sets are dropped
        run([lane(1, slot)], info)
    run([lane(1, 0)], info)
    assert program.packs == 7 + PACKED_PER_PROGRAM


def test_the_copy_to_the_host_starts_only_for_outputs_the_engine_reads():
    from helios_jax.runtime.executor import PROPOSAL_FIELDS, SCORE_FIELDS, RequestInputs, unread_fields

    info = {1: RequestInputs((5,), (0,)), 2: RequestInputs((5,), (1,), logprobs=True)}
    spec = GraphDescriptor(GraphKind.SPECULATIVE, 2, token_capacity=4, proposal_depth=3)

    def plan(graph, *rids):
        return SimpleNamespace(graph=graph, lanes=tuple(lane(r, r) for r in rids))

    assert unread_fields(plan(DECODE, 1), info) == SCORE_FIELDS | PROPOSAL_FIELDS
    assert unread_fields(plan(DECODE, 1, 2), info) == PROPOSAL_FIELDS  # one lane scores
    assert unread_fields(plan(spec, 1), info) == SCORE_FIELDS  # a round with proposals
    assert unread_fields(plan(DECODE, 1, 3), info) == PROPOSAL_FIELDS  # unknown inputs: read
