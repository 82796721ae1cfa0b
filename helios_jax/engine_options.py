"""The engine's command line as given: `EngineOptions`, unresolved until a model is loaded.

`EngineOptions.define_flags` registers the engine flags once for every program that builds an
engine or prepares its programs (`python -m helios_jax.prepare`, `python -m helios_jax.serve`),
in three groups: the prepared-program shapes (model, concurrency, prefill chunks, speculation and
its proposal depths and envelope R), the context and memory (context length, KV pages, snapshot
rows, dtype), and the scheduler policy flags that only a program running requests reads.
`EngineOptions.from_flags` reads them once and checks their ranges (a typo fails in a second,
before a model loads), and `EngineOptions.engine_config(model_config)` resolves what depends on
the model into the frozen `helios_jax.engine_config.EngineConfig`: an unset `--max_model_len` is
the model's own limit, at most 4096; an unset `--dtype` is the loaded model's; an unset
`--proposal_source` is learned proposals where the model has an MTP head and copy proposals where
it has none (an explicit `learned` there decodes ordinarily: nothing would draft); an unset
`--mixed_prefill` is the measured choice for the resolved speculation mode on this platform
(`mixed_prefill_default`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from absl import flags

from helios_jax.catalog import MAX_REQUEST_SLOTS, PROMPT_ALIGNMENT
from helios_jax.engine_config import (
    DEFAULT_MAX_MODEL_LEN,
    DTYPES,
    PROPOSAL_SOURCES,
    SPECULATION_MODES,
    EngineConfig,
    parse_int_list,
)

if TYPE_CHECKING:  # the model package imports jax; the fake server never loads it
    from helios_jax.model import ModelConfig
    from helios_jax.scheduler.config import PolicyConfig

SCHEDULER_POLICIES = ("balanced", "throughput")

# Step counts prepared when --decode_steps is unset (decode without speculation, width-one
# rounds with it): on the embedded model on a 2-core CPU they took the engine from 0.44x to 1.40x
# the naive loop at one stream without speculation, and an adaptive engine to 2.4x its
# single-step rate at one stream and 1.15x at sixteen (docs/benchmarks-engine.md).
MULTI_STEP_DEFAULT = (1, 4, 8)

# Timed runs of every program before serving (--measure_runs unset; docs/engine.md, "Measured
# start-up"): five samples make a median one disturbed run does not move, within the per-program
# time budget of runtime/scheduling.py.
MEASURE_RUNS_DEFAULT = 5

# Prompt rows B of the prefill programs prepared when --prefill_batch is unset: every power of
# four up to --concurrency. On the embedded model on a 2-core CPU, 16 simultaneous prompts ran at
# 1.07-1.20x the output tokens/s of one-row prefill (median of five interleaved repeats; TTFT
# from one initialize and four prefill[B=4] frames instead of sixteen of each;
# docs/benchmarks-engine.md). The selector runs them only where their measured duration pays.
PREFILL_BATCH_BASE = 4


def default_prefill_batch(concurrency: int) -> tuple[int, ...]:
    """The --prefill_batch an unset flag gives: 1, 4, 16, ... up to `concurrency`."""
    rows = [1]
    while rows[-1] * PREFILL_BATCH_BASE <= concurrency:
        rows.append(rows[-1] * PREFILL_BATCH_BASE)
    return tuple(rows)


# Where an unset --mixed_prefill prepares mixed prefill/verification programs: (platform as
# `jax.default_backend()` names it, resolved speculation mode) -> the measured choice. On a CPU,
# `prepare --measure` shows every mixed program slower than the prefill and generation programs it
# replaces (1.5-3.0x, `scripts/bench/mixed_pays.py`; docs/benchmarks-engine.md, "Mixed programs by
# default?"): off. Platforms not listed (GPU: not yet measured) keep them off; an explicit flag
# always wins.
MIXED_PREFILL_DEFAULT: dict[tuple[str, str], bool] = {
    ("cpu", "off"): False,
    ("cpu", "fixed"): False,
    ("cpu", "adaptive"): False,
}


def mixed_prefill_default(speculation: str, platform: str | None = None) -> bool:
    """What an unset ``--mixed_prefill`` means for `speculation` (``"off"``, ``"fixed"`` or
    ``"adaptive"``) on `platform` (``None``: the platform JAX computes on)."""
    if platform is None:
        import jax  # here: the fake server and flag parsing never load jax

        platform = jax.default_backend()
    return MIXED_PREFILL_DEFAULT.get((platform, speculation), False)


def _fail(flag: str, message: str) -> NoReturn:
    raise ValueError(f"--{flag} {message}")


def _check_int(flag: str, value, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(flag, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        _fail(flag, f"must be {f'{low}..{high}' if high is not None else f'>= {low}'}, got {value}")


def _check_nonnegative_float(flag: str, value) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        _fail(flag, f"must be finite and nonnegative, got {value!r}")


def _flag_int_list(flag: str, values: Sequence[str] | None) -> tuple[int, ...] | None:
    """A list flag's strings as integers (`parse_int_list`); unset or empty -> None."""
    try:
        return parse_int_list(values)
    except ValueError:
        _fail(flag, f"must be a comma-separated list of integers, got {','.join(values or ())!r}")


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The engine flags as given; ``None`` leaves the choice to the model (or the preset).

    Attributes:
      model: a Hugging Face style folder (config.json, *.safetensors, tokenizer.json); ``None``
        is the embedded default model shipped in the package.
      concurrency: request slots (resident requests), 1..64.
      prefill_chunks: prefill chunk sizes; ``None``: powers of two 64..4096 capped by the context.
      speculation: "off", "fixed" (host-allocated speculative programs) or "adaptive".
      draft_tokens: D, the deepest proposal depth (at least one unless speculation is off).
      proposal_depths: every captured proposal depth; ``None``: ``(draft_tokens,)``.
      speculative_token_capacity: R, the aggregate target-row envelope of wider programs.
      mixed_prefill: capture mixed prefill/verification graphs; ``None``: `mixed_prefill_default`
        for the resolved speculation mode and the platform (`MIXED_PREFILL_DEFAULT`), and off
        where no prefill chunk is a multiple of 64 (a mixed prompt row needs one).
      max_model_len: longest context (prompt + output); ``None``: the model's own limit, at most
        `DEFAULT_MAX_MODEL_LEN` (4096).
      page_size, kv_pages, snapshot_rows: the KV pool (``kv_pages`` ``None``: every state row at
        full context) and the checkpoint rows that snapshots write (``None``: one per request
        slot; 0: no checkpoint retention).
      dtype: "float32" or "bfloat16"; ``None``: float32 on a CPU (no bfloat16 arithmetic there),
        bfloat16 on a GPU (tensor cores; `helios_jax.prepare.default_dtype`).
      scheduler_policy: "balanced" or "throughput" (the spec's policy presets).
      scheduler_terminal_value, scheduler_terminal_age_price: terminal overrides applied after
        the preset; finite and nonnegative (zero disables the preference).
      mtp_adaptive_verification_alpha: exponent on prefix-survival estimates; finite and > 0.
      decode_steps: step counts K of the ordinary decode programs (speculation off) or of the
        width-one speculative programs (speculation on); ``(1,)``: single steps only. The flag,
        unset, gives `MULTI_STEP_DEFAULT` (the selector then picks K by value per time; the
        programs add compile time).
      prefill_batch: row counts B of the plain prefill programs (powers of two); ``(1,)``: one
        prompt per prefill; ``None`` (the flag unset): `default_prefill_batch`, 1, 4, 16, ... up
        to the concurrency.
      proposal_source: "learned", "copy" or "both" (`EngineConfig.proposal_source`); ``None``:
        learned with an MTP head, copy without one.
      tensor_parallel: devices each program is sharded over (`EngineConfig.tensor_parallel`);
        1: one device, no mesh.
      measure_runs: timed executions of every program before serving, whose samples seed the
        scheduler's duration estimates (`HeliosEngine(measure_runs=...)`); 0: the estimates
        start empty and each program is measured on its first use in service.
    """

    model: str | None = None
    concurrency: int = 4
    prefill_chunks: tuple[int, ...] | None = None
    speculation: str = "adaptive"
    draft_tokens: int = 3
    proposal_depths: tuple[int, ...] | None = None
    speculative_token_capacity: int = 64
    mixed_prefill: bool | None = None
    max_model_len: int | None = None
    page_size: int = 16
    kv_pages: int | None = None
    snapshot_rows: int | None = None
    dtype: str | None = None
    scheduler_policy: str = "balanced"
    scheduler_terminal_value: float | None = None
    scheduler_terminal_age_price: float | None = None
    mtp_adaptive_verification_alpha: float | None = None
    decode_steps: tuple[int, ...] = MULTI_STEP_DEFAULT
    prefill_batch: tuple[int, ...] | None = None
    proposal_source: str | None = None
    tensor_parallel: int = 1
    measure_runs: int = MEASURE_RUNS_DEFAULT

    def __post_init__(self):
        if self.model is not None and not self.model.strip():
            _fail("model", "must name a model folder (omit it for the embedded model)")
        _check_int("concurrency", self.concurrency, 1, MAX_REQUEST_SLOTS)
        self._check_lengths()
        if self.speculation not in SPECULATION_MODES:
            _fail("speculation", f"must be one of {', '.join(SPECULATION_MODES)}, got {self.speculation!r}")
        _check_int("draft_tokens", self.draft_tokens, 0)
        if self.speculation != "off" and self.draft_tokens < 1:
            _fail(
                "draft_tokens",
                f"must be at least 1 with --speculation={self.speculation} "
                "(use --speculation=off for ordinary decoding)",
            )
        for d in self.proposal_depths or ():
            _check_int("proposal_depths", d, 1)
        object.__setattr__(self, "decode_steps", tuple(self.decode_steps))
        for k in self.decode_steps:
            _check_int("decode_steps", k, 1)
        rows = default_prefill_batch(self.concurrency) if self.prefill_batch is None else self.prefill_batch
        object.__setattr__(self, "prefill_batch", tuple(rows))
        for b in self.prefill_batch:
            _check_int("prefill_batch", b, 1)
        _check_int("speculative_token_capacity", self.speculative_token_capacity, 0)
        _check_int("tensor_parallel", self.tensor_parallel, 1)
        _check_int("measure_runs", self.measure_runs, 0)
        if self.mixed_prefill is not None and not isinstance(self.mixed_prefill, bool):
            _fail("mixed_prefill", f"must be true or false, got {self.mixed_prefill!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            _fail("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.proposal_source is not None and self.proposal_source not in PROPOSAL_SOURCES:
            _fail(
                "proposal_source",
                f"must be one of {', '.join(PROPOSAL_SOURCES)}, got {self.proposal_source!r}",
            )
        self._check_policy()

    def _check_lengths(self) -> None:
        if self.prefill_chunks is not None:
            chunks = tuple(self.prefill_chunks)
            if not chunks:
                _fail("prefill_chunks", "needs at least one chunk size")
            for c in chunks:
                _check_int("prefill_chunks", c, 1)
            if len(set(chunks)) != len(chunks):
                _fail("prefill_chunks", f"repeats a chunk size: {chunks}")
            object.__setattr__(self, "prefill_chunks", chunks)
        if self.proposal_depths is not None:
            object.__setattr__(self, "proposal_depths", tuple(self.proposal_depths))
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, 1)
            if self.prefill_chunks is not None and max(self.prefill_chunks) > self.max_model_len:
                _fail("prefill_chunks", f"has a chunk longer than --max_model_len={self.max_model_len}")
        _check_int("page_size", self.page_size, 1)
        if self.kv_pages is not None:
            _check_int("kv_pages", self.kv_pages, 1)
        if self.snapshot_rows is not None:
            _check_int("snapshot_rows", self.snapshot_rows, 0)

    def _check_policy(self) -> None:
        if self.scheduler_policy not in SCHEDULER_POLICIES:
            _fail(
                "scheduler_policy",
                f"must be one of {', '.join(SCHEDULER_POLICIES)}, got {self.scheduler_policy!r}",
            )
        _check_nonnegative_float("scheduler_terminal_value", self.scheduler_terminal_value)
        _check_nonnegative_float("scheduler_terminal_age_price", self.scheduler_terminal_age_price)
        alpha = self.mtp_adaptive_verification_alpha
        if alpha is not None and (
            isinstance(alpha, bool)
            or not isinstance(alpha, (int, float))
            or not math.isfinite(alpha)
            or alpha <= 0
        ):
            _fail("mtp_adaptive_verification_alpha", f"must be finite and greater than zero, got {alpha!r}")

    # -- flags ----------------------------------------------------------------------------------
    @staticmethod
    def define_flags(flag_values: flags.FlagValues = flags.FLAGS, *, policy: bool = True) -> None:
        """Register the engine flags on `flag_values` (the spec's hyphenated flags with underscores).

        `policy` adds the scheduler policy flags and ``--measure_runs``, which only a program that
        runs requests reads (``python -m helios_jax.serve``); ``python -m helios_jax.prepare``
        leaves them out (its own ``--measure_runs`` times the programs for a measured catalog).
        """
        _define_program_shape_flags(flag_values)
        _define_context_and_memory_flags(flag_values)
        if policy:
            _define_policy_flags(flag_values)

    @classmethod
    def from_flags(cls, flag_values: flags.FlagValues = flags.FLAGS) -> EngineOptions:
        """The parsed engine flags, validated (ValueError names the bad flag). Flags that
        `define_flags` left out (the policy flags of prepare) keep their defaults."""
        f = flag_values
        fields = {field.name: getattr(f, field.name) for field in dataclasses.fields(cls) if field.name in f}
        fields["prefill_chunks"] = _flag_int_list("prefill_chunks", f.prefill_chunks)
        fields["proposal_depths"] = _flag_int_list("proposal_depths", f.proposal_depths)
        fields["decode_steps"] = _flag_int_list("decode_steps", f.decode_steps) or MULTI_STEP_DEFAULT
        fields["prefill_batch"] = _flag_int_list("prefill_batch", f.prefill_batch)
        return cls(**fields)

    # -- the configs built from the options -----------------------------------------------------
    def engine_config(self, model_config: ModelConfig | None = None, **overrides) -> EngineConfig:
        """The frozen `EngineConfig` for a loaded model; `overrides` replace any field.

        With `model_config` an unset `max_model_len` becomes the model's limit (at most
        `DEFAULT_MAX_MODEL_LEN`), an unset `dtype` the model's, and a model without an MTP head
        speculates with copy proposals (ordinarily under an explicit ``learned``: nothing would
        draft). Without one (planning only) they keep `EngineConfig`'s defaults.
        """
        speculation, source = self.speculation, self.proposal_source or "learned"
        if model_config is not None and not model_config.has_mtp:
            if self.proposal_source == "learned":
                speculation = "off"  # nothing drafts without a draft head
            source = "copy"  # the only source a model without a draft head has
        speculative = speculation != "off"
        fields = dict(
            request_slots=self.concurrency,
            prefill_chunks=self.prefill_chunks,
            speculation=speculation,
            draft_tokens=self.draft_tokens if speculative else 0,  # ordinary decoding drafts none
            proposal_depths=self.proposal_depths if speculative else None,
            speculative_token_capacity=self.speculative_token_capacity,
            mixed_prefill=self.mixed_prefill,
            page_size=self.page_size,
            kv_pages=self.kv_pages,
            snapshot_rows=self.snapshot_rows,
            decode_steps=self.decode_steps,
            prefill_batch=self.prefill_batch,
            proposal_source=source,
            tensor_parallel=self.tensor_parallel,
        )
        if self.max_model_len is not None:
            fields["max_model_len"] = self.max_model_len
        elif model_config is not None:
            fields["max_model_len"] = min(model_config.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        dtype = self.dtype or (model_config.dtype if model_config is not None else None)
        if dtype is not None:
            fields["dtype"] = dtype
        fields.update(overrides)
        if fields["mixed_prefill"] is not None:
            return EngineConfig(**fields)
        config = EngineConfig(**{**fields, "mixed_prefill": False})
        aligned = any(c % PROMPT_ALIGNMENT == 0 for c in config.prefill_chunks)
        if aligned and mixed_prefill_default(config.speculation):
            return config.replace(mixed_prefill=True)
        return config

    def policy_config(self) -> PolicyConfig:
        """The scheduler's ``PolicyConfig``: the named preset, then the terminal and alpha overrides."""
        from helios_jax.scheduler.config import PolicyConfig

        return PolicyConfig.preset(
            self.scheduler_policy,
            terminal_value=self.scheduler_terminal_value,
            terminal_age_price=self.scheduler_terminal_age_price,
            adaptive_verification_alpha=self.mtp_adaptive_verification_alpha,
        )


# -- the engine flags, by group -----------------------------------------------------------------


def _define_program_shape_flags(fv: flags.FlagValues) -> None:
    """The flags that decide which prepared programs exist: the model, the request slots, the
    prefill chunks, the speculation mode, its proposal depths and the envelope R, mixed capture."""
    flags.DEFINE_string(
        "model", None, "Hugging Face style model folder (default: the embedded model).", flag_values=fv
    )
    flags.DEFINE_integer("concurrency", 4, "Request slots (resident requests), 1..64.", flag_values=fv)
    flags.DEFINE_list(
        "prefill_chunks",
        None,
        "Prefill chunk sizes, e.g. 64,256,1024 (default: powers of two 64..4096 capped by the context).",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "speculation", "adaptive", list(SPECULATION_MODES), "Speculative decoding mode.", flag_values=fv
    )
    flags.DEFINE_integer("draft_tokens", 3, "Deepest proposal depth D of the MTP draft head.", flag_values=fv)
    flags.DEFINE_list(
        "proposal_depths", None, "Every captured proposal depth (default: draft_tokens).", flag_values=fv
    )
    flags.DEFINE_integer(
        "speculative_token_capacity", 64, "R: aggregate target rows of wider programs.", flag_values=fv
    )
    flags.DEFINE_bool(
        "mixed_prefill",
        None,
        "Capture mixed prefill/verification graphs (unset: as measured per platform and speculation "
        "mode, MIXED_PREFILL_DEFAULT).",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "proposal_source",
        None,
        list(PROPOSAL_SOURCES),
        "Who drafts speculative rounds: learned (MTP head), copy (prompt lookup) or both (per round, "
        "by the request's per-source acceptance); unset: learned, or copy for a model without MTP.",
        flag_values=fv,
    )
    flags.DEFINE_list(
        "decode_steps",
        None,
        "Step counts K of the decode programs (speculation off) or of the width-one speculative "
        "programs (speculation on); unset: 1,4,8.",
        flag_values=fv,
    )
    flags.DEFINE_list(
        "prefill_batch",
        None,
        "Prompt rows B of the prefill programs, e.g. 1,4,16 (powers of two; 1: one prompt per prefill); "
        "unset: 1, 4, 16, ... up to --concurrency.",
        flag_values=fv,
    )


def _define_context_and_memory_flags(fv: flags.FlagValues) -> None:
    """The flags that size the device state: context length, KV page size and pool, snapshot rows
    and the compute dtype."""
    flags.DEFINE_integer(
        "max_model_len",
        None,
        "Longest context in tokens, prompt plus output (default: "
        f"the model's limit, at most {DEFAULT_MAX_MODEL_LEN}).",
        flag_values=fv,
    )
    flags.DEFINE_integer("page_size", 16, "Tokens per KV page.", flag_values=fv)
    flags.DEFINE_integer(
        "kv_pages", None, "KV pool pages (default: every state row at full context).", flag_values=fv
    )
    flags.DEFINE_integer(
        "snapshot_rows",
        None,
        "Checkpoint rows that snapshots write and restores read, each with full-context pages "
        "(default: one per request slot; 0 turns checkpoint retention and prefix reuse off).",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "dtype",
        None,
        list(DTYPES),
        "Compute dtype (default: float32 on a CPU, bfloat16 on a GPU).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "tensor_parallel",
        1,
        "Devices every program is sharded over (a `tp` mesh axis: heads, KV heads, MLP and "
        "vocabulary split; docs/distributed.md); must divide the model's heads, KV heads, "
        "intermediate size and vocabulary. 1: one device.",
        flag_values=fv,
    )


def _define_policy_flags(fv: flags.FlagValues) -> None:
    """The scheduler policy preset, its overrides and the start-up measurement (only programs
    that run requests read them)."""
    flags.DEFINE_enum(
        "scheduler_policy",
        "balanced",
        list(SCHEDULER_POLICIES),
        "Scheduler policy preset.",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "scheduler_terminal_value", None, "Terminal value override (finite, >= 0).", flag_values=fv
    )
    flags.DEFINE_float(
        "scheduler_terminal_age_price",
        None,
        "Terminal age price override (finite, >= 0).",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "mtp_adaptive_verification_alpha",
        None,
        "Exponent on prefix-survival estimates (finite, > 0).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "measure_runs",
        MEASURE_RUNS_DEFAULT,
        "Timed executions of every program before serving; their samples seed the duration "
        "estimates (0: each program is measured on its first use).",
        flag_values=fv,
    )
