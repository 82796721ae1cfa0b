"""Command-line flags of ``python -m helios_jax.serve``, parsed into a frozen :class:`ServerConfig`.

Two groups:

* server flags (``--host``, ``--port``, ``--api_key``, ``--engine``, ``--served_model_name``,
  ``--fake_token_delay_ms``) that only the HTTP layer reads;
* engine flags (``--model``, ``--concurrency``, ``--prefill_chunks``, ``--speculation``,
  ``--draft_tokens``, ``--proposal_depths``, ``--speculative_token_capacity``,
  ``--mixed_prefill``, ``--max_model_len``, ``--page_size``, ``--kv_pages``, ``--snapshot_rows``,
  ``--dtype``, ``--scheduler_policy``, ``--scheduler_terminal_value``,
  ``--scheduler_terminal_age_price``, ``--mtp_adaptive_verification_alpha``), defined and read
  by :class:`helios_jax.engine_options.EngineOptions`, the same definition
  ``python -m helios_jax.prepare`` uses. Their ranges are checked here, so that a typo fails in
  a second, not after minutes of preparation; what depends on the model (the context length,
  the dtype) is resolved when the engine is built (``helios_jax.serve.engines``).

The spec's hyphenated flags (``--scheduler-policy``) are spelled with underscores, as absl wants.
:func:`define_flags` registers everything on a ``FlagValues`` (``__main__`` uses the global
``absl.flags.FLAGS``), so tests parse their own argument lists without touching global state.
"""

from __future__ import annotations

import dataclasses
import math

from absl import flags

from helios_jax.engine_options import EngineOptions

ENGINES = ("real", "fake")


def _fail(flag: str, message: str):
    raise ValueError(f"--{flag} {message}")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Everything ``python -m helios_jax.serve`` was asked for.

    Attributes:
      host, port: where to listen (port 0 picks a free port and logs it).
      api_key: when set, every ``/v1/*`` request needs ``Authorization: Bearer <api_key>``.
      engine: "real" (``helios_jax.runtime.engine``) or "fake" (``helios_jax.serve.fake``).
      served_model_name: the name clients send as ``model``; ``None``: the engine's model name.
      fake_token_delay_ms: per-token delay of the fake engine (ignored by the real one).
      engine_options: the engine flags, handed to the engine factory.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    engine: str = "real"
    served_model_name: str | None = None
    fake_token_delay_ms: float = 0.0
    engine_options: EngineOptions = EngineOptions()

    def __post_init__(self):
        if not self.host:
            _fail("host", "must not be empty")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            _fail("port", f"must be 0..65535, got {self.port!r}")
        if self.api_key is not None and not self.api_key.strip():
            _fail("api_key", "must not be empty when given")
        if self.engine not in ENGINES:
            _fail("engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            _fail("served_model_name", "must not be empty when given")
        delay = self.fake_token_delay_ms
        if (
            isinstance(delay, bool)
            or not isinstance(delay, (int, float))
            or not math.isfinite(delay)
            or delay < 0
        ):
            _fail("fake_token_delay_ms", f"must be finite and nonnegative, got {delay!r}")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Register the server's flags and the engine's (``EngineOptions.define_flags``) on `flag_values`."""
    fv = flag_values
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.", flag_values=fv)
    flags.DEFINE_integer(
        "port", 8000, "Port to listen on (0: a free port, logged at startup).", flag_values=fv
    )
    flags.DEFINE_string(
        "api_key", None, "Require 'Authorization: Bearer <key>' on /v1/* when set.", flag_values=fv
    )
    flags.DEFINE_enum(
        "engine",
        "real",
        list(ENGINES),
        "real: helios_jax.runtime.engine; fake: the deterministic fake engine of helios_jax.serve.fake.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "served_model_name", None, "Model name clients use (default: the engine's).", flag_values=fv
    )
    flags.DEFINE_float("fake_token_delay_ms", 0.0, "Per-token delay of --engine=fake, in ms.", flag_values=fv)
    EngineOptions.define_flags(flag_values)


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> ServerConfig:
    """The parsed flags as a validated :class:`ServerConfig` (ValueError names the bad flag)."""
    f = flag_values
    return ServerConfig(
        host=f.host,
        port=f.port,
        api_key=f.api_key,
        engine=f.engine,
        served_model_name=f.served_model_name,
        fake_token_delay_ms=f.fake_token_delay_ms,
        engine_options=EngineOptions.from_flags(f),
    )
