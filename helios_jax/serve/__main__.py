"""Entry point of ``python -m helios_jax.serve`` (``make serve``): flags in, a running server out.

All logic lives in importable modules: ``flags`` parses the command line into a frozen
``ServerConfig``, ``app.serve`` binds the port, builds the engine through ``app.build_engine``
(``--engine=fake`` or the real ``helios_jax.runtime.engine``), logs startup progress and serves
until SIGINT or SIGTERM.
"""
import sys

from absl import app as absl_app
from absl import flags

from helios_jax.serve import flags as serve_flags

serve_flags.define_flags(flags.FLAGS)


def main(argv) -> int:
    if len(argv) > 1:
        raise absl_app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = serve_flags.config_from_flags(flags.FLAGS)
    except ValueError as e:
        raise absl_app.UsageError(str(e)) from None
    from helios_jax.serve import app

    return app.serve(config)


if __name__ == "__main__":
    sys.exit(absl_app.run(main))
