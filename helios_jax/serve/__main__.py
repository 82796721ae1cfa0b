"""Entry point of ``python -m helios_jax.serve``.

The engine and HTTP server are not built yet; this entry says so and exits non-zero rather than
pretending to serve.
"""
import sys


def main() -> int:
    sys.stderr.write(
        "helios_jax.serve: the engine and HTTP server are not implemented yet "
        "(the scheduler core is); see README.md for what runs today.\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
