"""Which engine ``python -m helios_jax.serve`` runs: the factory it hands the server.

``--engine=fake`` gives :class:`helios_jax.serve.fake.FakeEngine` (context ``--max_model_len`` or
2048, per-token delay ``--fake_token_delay_ms``); otherwise
:func:`helios_jax.runtime.engine.build_real_engine` with the engine flags. The real engine's
module is imported only when that factory is chosen, so the fake never loads jax.
"""

from __future__ import annotations

import functools

from helios_jax.serve.app import EngineFactory
from helios_jax.serve.flags import ServerConfig, check_model_folder


def engine_factory(config: ServerConfig) -> EngineFactory:
    """The factory of the engine the flags ask for; calling it builds the engine. A --model
    that is not a model folder is a ValueError here, before anything is bound or loaded."""
    if config.engine == "fake":
        from helios_jax.serve.fake import FakeEngine

        return functools.partial(
            FakeEngine,
            max_model_len=config.engine_options.max_model_len or 2048,
            token_delay_s=config.fake_token_delay_ms / 1000.0,
        )
    check_model_folder(config.engine_options.model)
    from helios_jax.runtime.engine import build_real_engine

    return functools.partial(build_real_engine, config.engine_options)
