"""Entry point of ``python -m helios_jax.serve`` (``make serve``): flags in, a running server out.

All logic lives in importable modules: ``flags`` parses the command line into a frozen
``ServerConfig``, ``engines.engine_factory`` picks the engine (``--engine=fake`` or the real
``helios_jax.runtime.engine.build_real_engine``), and ``app.serve`` binds the port, calls the
factory, logs startup progress and serves until SIGINT or SIGTERM.
"""

import sys

from absl import app as absl_app
from absl import flags

from helios_jax import engine_options
from helios_jax.serve import flags as serve_flags

serve_flags.define_flags(flags.FLAGS)
# --help lists the flags of the main module: the server's and the engine's are defined elsewhere.
flags.adopt_module_key_flags(serve_flags)
flags.adopt_module_key_flags(engine_options)


def main(argv) -> int:
    if len(argv) > 1:
        raise absl_app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = serve_flags.config_from_flags(flags.FLAGS)
    except ValueError as e:
        raise absl_app.UsageError(str(e)) from None
    from helios_jax.serve import app, engines

    return app.serve(config, engines.engine_factory(config))


if __name__ == "__main__":
    sys.exit(absl_app.run(main))
