"""Several processes, one scheduler, on JAX's own distributed runtime (docs/distributed.md).

group.py     `--coordinator_address`, `--num_processes`, `--process_id` and
             `jax.distributed.initialize` (gloo collectives on a CPU)
channel.py   frames and committed-token digests through the coordination service's
             key-value store
leader.py    process 0: every program call is published, then run over the global mesh;
             completion reads rank zero's outputs and checks the followers' digests
follower.py  every other process: executes each published frame on its own devices
"""
