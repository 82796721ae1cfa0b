"""Every process but 0: executes the frames process 0 publishes, in order, on its own devices.

A follower builds the same `ProgramSet` as process 0 (the same flags, the same global mesh),
places its copy of the parameters and then only obeys (`follow`): `init` allocates a fresh
state, `run` calls the named prepared program on the published inputs (made replicated global
arrays from this process's copy, as the leader does) and answers with the digest of the tokens
it committed (`channel.committed_digest`), `stop` returns. A frame that raises answers with the
error, which the leader reports as a disagreement: the frame fails loudly on process 0.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable

from helios_jax.distributed.channel import FrameChannel, committed_digest
from helios_jax.distributed.leader import global_inputs, local_outputs
from helios_jax.programs.program_set import ProgramSet

log = logging.getLogger(__name__)


def follow(
    programs: ProgramSet,
    params,
    channel: FrameChannel,
    *,
    on_outputs: Callable[[int, object], None] | None = None,
    alter: Callable[[int, object], object] | None = None,
) -> int:
    """Runs frames until `stop`; returns how many frames were received.

    Args:
      programs: built over the group's global mesh, not led (plain `ProgramSet`).
      params: placed as the programs were lowered (`programs.place_params`).
      channel: the group's channel.
      on_outputs: called with (seq, this process's copy of the outputs) after each `run`.
      alter: (seq, host inputs) -> inputs actually run: a diverged follower, for tests of the
        leader's check.
    """
    seq, state = 0, None
    while True:
        message = pickle.loads(channel.receive(seq))
        if message[0] == "stop":
            return seq + 1
        try:
            if message[0] == "init":
                state, digest = programs.init_state(fill=message[1]), "init"
            else:
                _, key, host = message
                if alter is not None:
                    host = alter(seq, host)
                state, outputs = programs[key](params, state, global_inputs(programs.mesh, host))
                outputs = local_outputs(outputs)
                digest = committed_digest(outputs)
                if on_outputs is not None:
                    on_outputs(seq, outputs)
        except Exception as e:  # answered, so that process 0 fails this frame loudly
            log.exception("frame %d failed on this process", seq)
            digest = f"error: {type(e).__name__}: {e}"
        channel.answer(seq, digest)
        seq += 1
