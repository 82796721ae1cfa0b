"""`python -m helios_jax.serve` over several processes: which process does what.

Every process is started with the same engine flags plus `--coordinator_address`,
`--num_processes` and its own `--process_id`. Process 0 builds the engine as a single process
does (its `prepare` leads the followers: `group.lead_if_leader`), serves HTTP, plans and
commits, and publishes `stop` when its server ends. Every other process loads the same model,
prepares the same programs over the same global mesh and follows (`follower.follow`); it
serves nothing.
"""

from __future__ import annotations

import os

from absl import logging

from helios_jax.compilation_cache import enable_compilation_cache
from helios_jax.distributed.follower import follow
from helios_jax.distributed.group import Group
from helios_jax.engine_options import EngineOptions


def run_follower(options: EngineOptions, group: Group) -> int:
    """Loads and prepares what process 0 does, then executes its frames until `stop`."""
    from helios_jax.prepare import load_engine_model, prepare

    enable_compilation_cache()
    model = load_engine_model(options.model, dtype=options.dtype, tensor_parallel=options.tensor_parallel)
    name = os.path.basename(os.path.normpath(options.model)) if options.model else "helios-default"
    engine = options.engine_config(model.config)
    prepared = prepare(model.config, model.params, engine, name=name, progress=logging.info)
    logging.info("process %d of %d follows process 0", group.process_id, group.num_processes)
    frames = follow(prepared.programs, prepared.params, group.channel)
    logging.info("process %d stopped after %d frames", group.process_id, frames)
    return 0


def serve_in_group(group: Group | None, options: EngineOptions, serve) -> int:
    """One process, or process 0: `serve()` (then stop the followers); any other: follow."""
    if group is not None and not group.leader:
        return run_follower(options, group)
    try:
        return serve()
    finally:
        if group is not None:
            from helios_jax.distributed.leader import stop_followers

            stop_followers()
