"""Command-line flags of ``python -m helios_jax.serve``, parsed into a frozen :class:`ServerConfig`.

Two groups:

* server flags (``--host``, ``--port``, ``--api_key``, ``--engine``, ``--served_model_name``,
  ``--fake_token_delay_ms``, ``--allowed_origins``, ``--drain_timeout_s``,
  ``--max_prompt_chars``, ``--max_body_bytes``) that only the HTTP layer reads; the API key may
  come from the environment instead (``HELIOS_API_KEY``, or vLLM's ``VLLM_API_KEY``), so that
  it need not appear in the process list;
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
import os
from collections.abc import Mapping

from absl import flags

from helios_jax.engine_options import EngineOptions
from helios_jax.serve.tool_calls import TOOL_PARSERS

ENGINES = ("real", "fake")
API_KEY_VARIABLES = ("HELIOS_API_KEY", "VLLM_API_KEY")  # read in this order when --api_key is unset
MAX_BODY_BYTES = 16 * 1024 * 1024


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
      allowed_origins: CORS: the origins browsers may call from ("*": any); empty: no CORS.
      drain_timeout_s: on SIGTERM/SIGINT, how long requests in flight may still run.
      max_prompt_chars: longest prompt, in characters, that is tokenized at all; None: 64 per
        token of the engine's context.
      max_body_bytes: longest request body.
      tool_call_parser: chat tool calling's output format (serve/tool_calls.py), parsed when
        ``tool_choice`` is "auto"; None: "auto" is a 400, as in vLLM without
        ``--enable-auto-tool-choice``.
      engine_options: the engine flags, handed to the engine factory.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    engine: str = "real"
    served_model_name: str | None = None
    fake_token_delay_ms: float = 0.0
    allowed_origins: tuple[str, ...] = ()
    drain_timeout_s: float = 20.0
    max_prompt_chars: int | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    tool_call_parser: str | None = None
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
        self._check_http_limits()

    def _check_http_limits(self) -> None:
        drain = self.drain_timeout_s
        if isinstance(drain, bool) or not isinstance(drain, (int, float)) or not 0 <= drain < math.inf:
            _fail("drain_timeout_s", f"must be finite and nonnegative, got {drain!r}")
        if self.max_prompt_chars is not None and self.max_prompt_chars < 1:
            _fail("max_prompt_chars", f"must be at least 1, got {self.max_prompt_chars}")
        if self.max_body_bytes < 1024:
            _fail("max_body_bytes", f"must be at least 1024, got {self.max_body_bytes}")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            _fail(
                "tool_call_parser", f"must be one of {', '.join(TOOL_PARSERS)}, got {self.tool_call_parser!r}"
            )
        if any(not origin.strip() for origin in self.allowed_origins):
            _fail("allowed_origins", "must not contain empty origins")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Register the server's flags and the engine's (``EngineOptions.define_flags``) on `flag_values`."""
    fv = flag_values
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.", flag_values=fv)
    flags.DEFINE_integer(
        "port", 8000, "Port to listen on (0: a free port, logged at startup).", flag_values=fv
    )
    flags.DEFINE_string(
        "api_key",
        None,
        "Require 'Authorization: Bearer <key>' on /v1/*, /tokenize and /detokenize when set "
        "(default: $HELIOS_API_KEY, else $VLLM_API_KEY, else no key).",
        flag_values=fv,
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
    _define_http_flags(fv)
    EngineOptions.define_flags(flag_values)


def _define_http_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_list(
        "allowed_origins",
        [],
        "CORS: origins browsers may call the API from, comma-separated ('*': any); empty: CORS off.",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "drain_timeout_s",
        20.0,
        "On SIGTERM/SIGINT: stop admitting, let requests in flight run this long, then end them.",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "max_prompt_chars",
        None,
        "Longest prompt in characters that is tokenized at all (default: 64 per token of context).",
        flag_values=fv,
    )
    flags.DEFINE_integer("max_body_bytes", MAX_BODY_BYTES, "Longest request body, in bytes.", flag_values=fv)
    flags.DEFINE_bool(
        "enable_auto_tool_choice",
        False,
        'Parse chat output for tool calls when tool_choice is "auto" (needs --tool_call_parser).',
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "tool_call_parser",
        None,
        list(TOOL_PARSERS),
        "The tool call format of the model's output (hermes: Qwen2.5, Qwen3, Hermes).",
        flag_values=fv,
    )


def api_key_from(flag_value: str | None, environ: Mapping[str, str]) -> str | None:
    """--api_key, else the first nonempty variable of API_KEY_VARIABLES, else None."""
    if flag_value is not None:
        return flag_value
    return next((environ[v] for v in API_KEY_VARIABLES if environ.get(v, "").strip()), None)


def check_model_folder(model: str | None) -> None:
    """--model must be a folder with a config.json (None: the embedded model): a Hub id or a
    typo fails here, in one line, before the port is bound."""
    if model is None or os.path.isfile(os.path.join(model, "config.json")):
        return
    if os.path.isdir(model):
        _fail("model", f"must be a model folder with config.json; {model!r} has none")
    _fail(
        "model",
        f"must be a local model folder (config.json, *.safetensors, tokenizer.json); {model!r} is "
        "not a folder (Hub ids are not downloaded: fetch the folder first, e.g. with "
        "`huggingface-cli download`)",
    )


def _tool_call_parser(f: flags.FlagValues) -> str | None:
    """--tool_call_parser when --enable_auto_tool_choice (which needs it, as in vLLM)."""
    if f.enable_auto_tool_choice and f.tool_call_parser is None:
        _fail("enable_auto_tool_choice", "needs --tool_call_parser")
    return f.tool_call_parser if f.enable_auto_tool_choice else None


def config_from_flags(
    flag_values: flags.FlagValues = flags.FLAGS, environ: Mapping[str, str] = os.environ
) -> ServerConfig:
    """The parsed flags as a validated :class:`ServerConfig` (ValueError names the bad flag);
    `environ` supplies the API key when --api_key is unset."""
    f = flag_values
    return ServerConfig(
        host=f.host,
        port=f.port,
        api_key=api_key_from(f.api_key, environ),
        engine=f.engine,
        served_model_name=f.served_model_name,
        fake_token_delay_ms=f.fake_token_delay_ms,
        allowed_origins=tuple(o.strip() for o in f.allowed_origins),
        drain_timeout_s=f.drain_timeout_s,
        max_prompt_chars=f.max_prompt_chars,
        max_body_bytes=f.max_body_bytes,
        tool_call_parser=_tool_call_parser(f),
        engine_options=EngineOptions.from_flags(f),
    )
