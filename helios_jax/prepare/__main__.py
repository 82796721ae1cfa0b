"""``python -m helios_jax.prepare`` and the ``helios-prepare`` command: see `helios_jax.prepare.command`."""

from absl import flags

from helios_jax import console, engine_options
from helios_jax.prepare import command

command.define_flags()
# --help lists the flags of the main module: the engine's and prepare's own are defined elsewhere.
flags.adopt_module_key_flags(engine_options)
flags.adopt_module_key_flags(command)


def run() -> None:
    """The ``helios-prepare`` console command."""
    console.run(command.main, engine_options, command)


if __name__ == "__main__":
    run()
