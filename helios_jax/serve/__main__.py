"""Entry point of ``python -m helios_jax.serve`` (``make serve``): flags in, a running server out.

All logic lives in importable modules: ``flags`` parses the command line into a frozen
``ServerConfig``, ``engines.engine_factory`` picks the engine (``--engine=fake`` or the real
``helios_jax.runtime.engine.build_real_engine``), and ``app.serve`` binds the port, calls the
factory, logs startup progress and serves until SIGINT or SIGTERM.
"""

from absl import app as absl_app
from absl import flags

from helios_jax import console, engine_options
from helios_jax.distributed import group as process_group
from helios_jax.serve import flags as serve_flags

serve_flags.define_flags(flags.FLAGS)
process_group.define_flags(flags.FLAGS)
# --help lists the key flags of the main module (absl names it by sys.argv[0]): the server's and
# the engine's are defined elsewhere, so they are adopted here, and again under the console
# command's name by run().
flags.adopt_module_key_flags(serve_flags)
flags.adopt_module_key_flags(engine_options)
flags.adopt_module_key_flags(process_group)


def main(argv) -> int:
    if len(argv) > 1:
        raise absl_app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from helios_jax.distributed import serving
    from helios_jax.serve import app, engines

    try:
        config = serve_flags.config_from_flags(flags.FLAGS)
        factory = engines.engine_factory(config)
        group = process_group.initialize_from_flags(flags.FLAGS)  # None: one process
    except ValueError as e:
        raise absl_app.UsageError(str(e)) from None
    return serving.serve_in_group(group, config.engine_options, lambda: app.serve(config, factory))


def run() -> None:
    """The ``helios-serve`` console command."""
    console.run(main, serve_flags, engine_options, process_group)


if __name__ == "__main__":
    run()
