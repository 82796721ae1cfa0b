"""``python -m helios_jax.prepare``: see `helios_jax.prepare.command`."""

from absl import app, flags

from helios_jax import engine_options
from helios_jax.prepare import command

command.define_flags()
# --help lists the flags of the main module: the engine's and prepare's own are defined elsewhere.
flags.adopt_module_key_flags(engine_options)
flags.adopt_module_key_flags(command)
app.run(command.main)
