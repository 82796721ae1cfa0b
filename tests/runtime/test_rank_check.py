"""Several processes (docs/distributed.md), the parts that need no second process: the flags,
the committed-token digest, and the engine failing a frame whose ranks disagree."""

import pickle

import numpy as np
import pytest
from absl import flags

from helios_jax.catalog import GraphKind
from helios_jax.distributed import group
from helios_jax.distributed.channel import committed_digest
from helios_jax.distributed.follower import follow
from helios_jax.distributed.leader import Leader, RanksDisagree
from helios_jax.engine_config import EngineConfig
from helios_jax.model.sharding import tensor_parallel_mesh
from helios_jax.runtime.api import GenerationRequest, SamplingParams
from helios_jax.runtime.engine import HeliosEngine

from .helpers import tokenizer
from .test_executor import FakeDevice, FakeOutputs, FakeProgram, FakeSet

spec = pytest.mark.spec


def test_one_process_initializes_nothing_and_several_need_a_coordinator():
    fv = flags.FlagValues()
    group.define_flags(fv)
    fv(["prog"])
    assert (fv.coordinator_address, fv.num_processes, fv.process_id) == (None, 1, 0)
    assert group.initialize_from_flags(fv) is None and group.current() is None
    with pytest.raises(ValueError, match="coordinator_address"):
        group.initialize(None, 2, 0)
    with pytest.raises(ValueError, match="process_id=2"):
        group.initialize("localhost:1", 2, 2)


def test_the_digest_covers_committed_tokens_counts_and_consumption_only():
    base = FakeOutputs(
        tokens=np.array([[4, 9], [6, 1]]), counts=np.array([1, 2]), query_lengths=np.array([2, 2])
    )
    same = FakeOutputs(
        tokens=np.array([[4, 0], [6, 1]]), counts=np.array([1, 2]), query_lengths=np.array([2, 2])
    )
    assert committed_digest(base) == committed_digest(same)  # past the count: not committed
    for tokens, counts, query in (
        ([[4, 9], [6, 2]], [1, 2], [2, 2]),  # a committed token
        ([[4, 9], [6, 1]], [2, 2], [2, 2]),  # a count
        ([[4, 9], [6, 1]], [1, 2], [2, 1]),  # consumption
        ([[4, 6], [1, 0]], [2, 1], [2, 2]),  # the same tokens, split otherwise between the lanes
    ):
        other = FakeOutputs(tokens=np.array(tokens), counts=np.array(counts), query_lengths=np.array(query))
        assert committed_digest(other) != committed_digest(base)
    assert committed_digest(FakeOutputs()) == committed_digest(FakeOutputs(entry=1)) == "nothing"


class DisagreeingProgram(FakeProgram):
    """A decode program whose `check` (the leader's digest comparison) fails its third frame."""

    def check(self, outputs):
        if self.descriptor.kind is not GraphKind.DECODE:
            return
        self.device.decodes = getattr(self.device, "decodes", 0) + 1
        if self.device.decodes == 3:
            raise RanksDisagree("frame 9: processes [1] committed other tokens than rank zero")


@spec("confidence-acceptance/rank-agreement")
def test_a_frame_whose_ranks_disagree_fails_its_requests_loudly_and_the_engine_serves_on():
    ec = EngineConfig(
        request_slots=4, prefill_chunks=(64,), speculation="off", draft_tokens=0, max_model_len=512
    )
    device = FakeDevice()
    programs = FakeSet({g.key: DisagreeingProgram(g, device, g.batch_capacity) for g in ec.catalog().graphs})
    engine = HeliosEngine(
        model_config=None, params=None, tokenizer=tokenizer(), engine_config=ec, programs=programs
    )
    try:
        first = list(
            engine.submit(GenerationRequest("a", (5,) * 8, SamplingParams(max_tokens=10, temperature=0)))
        )
        later = list(
            engine.submit(GenerationRequest("b", (5,) * 8, SamplingParams(max_tokens=4, temperature=0)))
        )
    finally:
        engine.shutdown()
    assert first[-1].finish_reason == "error" and "committed other tokens than rank zero" in first[-1].error
    assert sum(len(e.token_ids) for e in first) < 10  # nothing of the failed frame was emitted
    assert later[-1].finish_reason == "length" and sum(len(e.token_ids) for e in later) == 4


class FakeChannel:
    """The key-value store's frames and answers, in memory."""

    def __init__(self, frames=(), answers=None):
        self.frames = [pickle.dumps(f) for f in frames]
        self.answered, self.given, self.forgotten = {}, answers or {}, []

    def receive(self, seq):
        return self.frames[seq]

    def answer(self, seq, digest):
        self.answered[seq] = digest

    def answers(self, seq):
        return self.given[seq]

    def forget(self, seq):
        self.forgotten.append(seq)


class FollowedPrograms(dict):
    mesh = tensor_parallel_mesh(1)

    def init_state(self, fill=0.0):
        return {"fill": fill}


def test_a_follower_runs_frames_in_order_and_answers_digests_or_errors():
    def decode(params, state, inputs):
        return state, FakeOutputs(tokens=inputs["tokens"], counts=np.asarray([1]))

    def broken(params, state, inputs):
        raise FloatingPointError("device fault")

    tokens = np.asarray([[7]])
    frames = [("init", 0.0), ("run", "decode", {"tokens": tokens}), ("run", "broken", {}), ("stop",)]
    channel = FakeChannel(frames)
    assert follow(FollowedPrograms(decode=decode, broken=broken), None, channel) == 4
    want = committed_digest(FakeOutputs(tokens=tokens, counts=np.asarray([1])))
    assert channel.answered == {0: "init", 1: want, 2: "error: FloatingPointError: device fault"}


def test_the_leader_fails_a_frame_any_follower_disagrees_on_and_quotes_its_error():
    channel = FakeChannel(answers={3: {1: "d", 2: "d"}, 4: {1: "d", 2: "error: ValueError: x"}})
    leader = Leader(channel, tensor_parallel_mesh(1))
    leader.verify(3, "d")
    with pytest.raises(RanksDisagree, match=r"frame 4: processes \[2\] .*; process 2: error: ValueError: x"):
        leader.verify(4, "d")
    assert channel.forgotten == [3, 4]
