"""Command-line flags of ``python -m helios_jax.serve``, parsed into a frozen :class:`ServerConfig`.

Two groups:

* server flags (``--host``, ``--port``, ``--api_key``, ``--engine``, ``--served_model_name``,
  ``--fake_token_delay_ms``) that only the HTTP layer reads;
* engine flags (``--model``, ``--concurrency``, ``--prefill_chunks``, ``--speculation``,
  ``--draft_tokens``, ``--speculative_token_capacity``, ``--mixed_prefill``,
  ``--scheduler_policy``, ``--scheduler_terminal_value``, ``--scheduler_terminal_age_price``,
  ``--mtp_adaptive_verification_alpha``, ``--max_model_len``) collected untouched into
  :class:`EngineOptions`, the ``config`` that ``helios_jax.runtime.engine.build_engine(config)``
  receives. The server checks their ranges so that a typo fails in a second, not after minutes
  of preparation; what they mean is the engine's business (:meth:`EngineOptions.policy_config`
  and :meth:`EngineOptions.engine_config` are conveniences that build the scheduler's and the
  engine's own configs from them).

The spec's hyphenated flags (``--scheduler-policy``) are spelled with underscores, as absl wants.
:func:`define_flags` registers everything on a ``FlagValues`` (``__main__`` uses the global
``absl.flags.FLAGS``), so tests parse their own argument lists without touching global state.
"""
from __future__ import annotations

import dataclasses
import math

from absl import flags

from helios_jax.catalog import MAX_REQUEST_SLOTS as MAX_CONCURRENCY

SPECULATION_MODES = ("off", "fixed", "adaptive")
SCHEDULER_POLICIES = ("balanced", "throughput")
ENGINES = ("real", "fake")


def _fail(flag: str, message: str):
    raise ValueError(f"--{flag} {message}")


def _check_int(flag: str, value, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(flag, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        _fail(flag, f"must be {f'{low}..{high}' if high is not None else f'>= {low}'}, got {value}")


def _check_nonnegative_float(flag: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        _fail(flag, f"must be finite and nonnegative, got {value!r}")


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The engine flags as given; ``None`` leaves the choice to the engine (or the preset).

    Attributes:
      model: a Hugging Face style folder (config.json, *.safetensors, tokenizer.json); ``None``
        is the embedded default model shipped in the package.
      concurrency: request slots (resident requests), 1..64.
      prefill_chunks: prefill chunk sizes; ``None``: powers of two 64..4096 capped by the context.
      speculation: "off", "fixed" (host-allocated speculative programs) or "adaptive".
      draft_tokens: D, the deepest proposal depth (at least one unless speculation is off).
      speculative_token_capacity: R, the aggregate target-row envelope of wider programs.
      mixed_prefill: capture mixed prefill/verification graphs.
      scheduler_policy: "balanced" or "throughput" (the spec's policy presets).
      scheduler_terminal_value, scheduler_terminal_age_price: terminal overrides applied after
        the preset; finite and nonnegative (zero disables the preference).
      mtp_adaptive_verification_alpha: exponent on prefix-survival estimates; finite and > 0.
      max_model_len: longest context (prompt + output); ``None``: the model's own limit.
    """

    model: str | None = None
    concurrency: int = 4
    prefill_chunks: tuple[int, ...] | None = None
    speculation: str = "adaptive"
    draft_tokens: int = 3
    speculative_token_capacity: int = 64
    mixed_prefill: bool = False
    scheduler_policy: str = "balanced"
    scheduler_terminal_value: float | None = None
    scheduler_terminal_age_price: float | None = None
    mtp_adaptive_verification_alpha: float | None = None
    max_model_len: int | None = None

    def __post_init__(self):
        if self.model is not None and not self.model.strip():
            _fail("model", "must name a model folder (omit it for the embedded model)")
        _check_int("concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        if self.prefill_chunks is not None:
            chunks = tuple(self.prefill_chunks)
            if not chunks:
                _fail("prefill_chunks", "needs at least one chunk size")
            for c in chunks:
                _check_int("prefill_chunks", c, 1)
            if len(set(chunks)) != len(chunks):
                _fail("prefill_chunks", f"repeats a chunk size: {chunks}")
            object.__setattr__(self, "prefill_chunks", chunks)
        if self.speculation not in SPECULATION_MODES:
            _fail("speculation", f"must be one of {', '.join(SPECULATION_MODES)}, got {self.speculation!r}")
        _check_int("draft_tokens", self.draft_tokens, 0)
        if self.speculation != "off" and self.draft_tokens < 1:
            _fail("draft_tokens", f"must be at least 1 with --speculation={self.speculation} "
                                  "(use --speculation=off for ordinary decoding)")
        _check_int("speculative_token_capacity", self.speculative_token_capacity, 0)
        if self.scheduler_policy not in SCHEDULER_POLICIES:
            _fail("scheduler_policy", f"must be one of {', '.join(SCHEDULER_POLICIES)}, "
                                      f"got {self.scheduler_policy!r}")
        _check_nonnegative_float("scheduler_terminal_value", self.scheduler_terminal_value)
        _check_nonnegative_float("scheduler_terminal_age_price", self.scheduler_terminal_age_price)
        alpha = self.mtp_adaptive_verification_alpha
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                                  or not math.isfinite(alpha) or alpha <= 0):
            _fail("mtp_adaptive_verification_alpha", f"must be finite and greater than zero, got {alpha!r}")
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, 1)
            if self.prefill_chunks is not None and max(self.prefill_chunks) > self.max_model_len:
                _fail("prefill_chunks", f"has a chunk longer than --max_model_len={self.max_model_len}")

    def policy_config(self):
        """The scheduler's ``PolicyConfig``: the named preset, then the terminal and alpha overrides."""
        from helios_jax.scheduler.config import PolicyConfig

        return PolicyConfig.preset(
            self.scheduler_policy,
            terminal_value=self.scheduler_terminal_value,
            terminal_age_price=self.scheduler_terminal_age_price,
            adaptive_verification_alpha=self.mtp_adaptive_verification_alpha,
        )

    def engine_config(self, **overrides):
        """``helios_jax.engine_config.EngineConfig`` from these options (``max_model_len`` left to
        the config's default when unset); `overrides` replace any field."""
        from helios_jax.engine_config import EngineConfig

        fields = dict(request_slots=self.concurrency, prefill_chunks=self.prefill_chunks,
                      speculation=self.speculation, draft_tokens=self.draft_tokens,
                      speculative_token_capacity=self.speculative_token_capacity,
                      mixed_prefill=self.mixed_prefill)
        if self.speculation == "off":
            fields["draft_tokens"] = 0  # ordinary decoding captures no proposal depth
        if self.max_model_len is not None:
            fields["max_model_len"] = self.max_model_len
        fields.update(overrides)
        return EngineConfig(**fields)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Everything ``python -m helios_jax.serve`` was asked for.

    Attributes:
      host, port: where to listen (port 0 picks a free port and logs it).
      api_key: when set, every ``/v1/*`` request needs ``Authorization: Bearer <api_key>``.
      engine: "real" (``helios_jax.runtime.engine``) or "fake" (``helios_jax.serve.fake``).
      served_model_name: the name clients send as ``model``; ``None``: the engine's model name.
      fake_token_delay_ms: per-token delay of the fake engine (ignored by the real one).
      engine_options: the engine flags, passed to the engine untouched.
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
        _check_int("port", self.port, 0, 65535)
        if self.api_key is not None and not self.api_key.strip():
            _fail("api_key", "must not be empty when given")
        if self.engine not in ENGINES:
            _fail("engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            _fail("served_model_name", "must not be empty when given")
        _check_nonnegative_float("fake_token_delay_ms", self.fake_token_delay_ms)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Register the server's flags on `flag_values`."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("model", None, "Hugging Face style model folder (default: the embedded model).", **fv)
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.", **fv)
    flags.DEFINE_integer("port", 8000, "Port to listen on (0: a free port, logged at startup).", **fv)
    flags.DEFINE_string("api_key", None, "Require 'Authorization: Bearer <key>' on /v1/* when set.", **fv)
    flags.DEFINE_enum("engine", "real", list(ENGINES), "real: helios_jax.runtime.engine; fake: the "
                      "deterministic fake engine of helios_jax.serve.fake.", **fv)
    flags.DEFINE_string("served_model_name", None, "Model name clients use (default: the engine's).", **fv)
    flags.DEFINE_float("fake_token_delay_ms", 0.0, "Per-token delay of --engine=fake, in ms.", **fv)
    flags.DEFINE_integer("concurrency", 4, "Request slots (resident requests), 1..64.", **fv)
    flags.DEFINE_list("prefill_chunks", None, "Prefill chunk sizes, e.g. 64,256,1024 "
                      "(default: powers of two 64..4096 capped by the context).", **fv)
    flags.DEFINE_enum("speculation", "adaptive", list(SPECULATION_MODES), "Speculative decoding mode.", **fv)
    flags.DEFINE_integer("draft_tokens", 3, "Deepest proposal depth D of the MTP draft head.", **fv)
    flags.DEFINE_integer("speculative_token_capacity", 64, "R: aggregate target rows of wider programs.", **fv)
    flags.DEFINE_bool("mixed_prefill", False, "Capture mixed prefill/verification graphs.", **fv)
    flags.DEFINE_enum("scheduler_policy", "balanced", list(SCHEDULER_POLICIES), "Scheduler policy preset.", **fv)
    flags.DEFINE_float("scheduler_terminal_value", None, "Terminal value override (finite, >= 0).", **fv)
    flags.DEFINE_float("scheduler_terminal_age_price", None, "Terminal age price override (finite, >= 0).", **fv)
    flags.DEFINE_float("mtp_adaptive_verification_alpha", None,
                       "Exponent on prefix-survival estimates (finite, > 0).", **fv)
    flags.DEFINE_integer("max_model_len", None, "Longest context in tokens (default: the model's).", **fv)


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> ServerConfig:
    """The parsed flags as a validated :class:`ServerConfig` (ValueError names the bad flag)."""
    f = flag_values
    chunks = f.prefill_chunks
    if chunks:
        try:
            chunks = tuple(int(c) for c in chunks)
        except ValueError:
            _fail("prefill_chunks", f"must be a comma-separated list of integers, got {','.join(chunks)!r}")
    else:
        chunks = None
    options = EngineOptions(
        model=f.model, concurrency=f.concurrency, prefill_chunks=chunks, speculation=f.speculation,
        draft_tokens=f.draft_tokens, speculative_token_capacity=f.speculative_token_capacity,
        mixed_prefill=f.mixed_prefill, scheduler_policy=f.scheduler_policy,
        scheduler_terminal_value=f.scheduler_terminal_value,
        scheduler_terminal_age_price=f.scheduler_terminal_age_price,
        mtp_adaptive_verification_alpha=f.mtp_adaptive_verification_alpha, max_model_len=f.max_model_len)
    return ServerConfig(host=f.host, port=f.port, api_key=f.api_key, engine=f.engine,
                        served_model_name=f.served_model_name, fake_token_delay_ms=f.fake_token_delay_ms,
                        engine_options=options)

