"""The console commands (pyproject's ``[project.scripts]``): absl programs under their own name.

absl's ``--help`` lists the key flags of the main module, which it names by ``sys.argv[0]``.
Under ``python -m`` that is the entry module, whose imports adopt the flags defined elsewhere;
under a console script it is the script's path (``.../bin/helios-prepare``), a module nobody
defined flags for, so ``--help`` would print none. `run` registers the given modules' key flags
under that name too, then runs ``main`` as ``absl.app.run`` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

from absl import app, flags


def adopt_for_help(*modules: ModuleType) -> None:
    """Make the modules' key flags key flags of the program named by ``sys.argv[0]``."""
    for module in modules:
        for flag in flags.FLAGS.get_key_flags_for_module(module):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run(main: Callable[[list[str]], int | None], *modules: ModuleType) -> None:
    """Run ``main(argv)`` under absl with ``modules``' flags in ``--help``; exit with its status."""
    adopt_for_help(*modules)
    app.run(lambda argv: sys.exit(main(argv)))
