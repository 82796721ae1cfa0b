"""absl flags parse into a frozen ServerConfig; bad values fail naming the flag."""

import dataclasses
import importlib.util
import types

import jax
import pytest
from absl import flags

from helios_jax import engine_options
from helios_jax.engine_options import EngineOptions, mixed_prefill_default
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.serve.engines import engine_factory
from helios_jax.serve.fake import FakeEngine
from helios_jax.serve.flags import ServerConfig, config_from_flags, define_flags

spec = pytest.mark.spec


def parse(*args: str) -> ServerConfig:
    fv = flags.FlagValues()
    define_flags(fv)
    fv(["serve", *args])
    return config_from_flags(fv)


def test_defaults():
    config = parse()
    assert (config.host, config.port, config.api_key, config.engine) == ("127.0.0.1", 8000, None, "real")
    assert config.engine_options == EngineOptions()
    assert config.engine_options.model is None  # the embedded model
    assert config.engine_options.measure_runs == 5  # the server measures before serving
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1


def test_engine_flags_pass_through_untouched():
    options = parse(
        "--model=/models/qwen3",
        "--concurrency=16",
        "--prefill_chunks=256,64",
        "--speculation=fixed",
        "--draft_tokens=7",
        "--speculative_token_capacity=128",
        "--mixed_prefill",
        "--scheduler_policy=throughput",
        "--scheduler_terminal_value=0",
        "--scheduler_terminal_age_price=2.5",
        "--mtp_adaptive_verification_alpha=0.5",
        "--max_model_len=8192",
        "--measure_runs=0",
    ).engine_options
    assert options == EngineOptions(
        model="/models/qwen3",
        concurrency=16,
        prefill_chunks=(256, 64),
        speculation="fixed",
        draft_tokens=7,
        speculative_token_capacity=128,
        mixed_prefill=True,
        scheduler_policy="throughput",
        scheduler_terminal_value=0.0,
        scheduler_terminal_age_price=2.5,
        mtp_adaptive_verification_alpha=0.5,
        max_model_len=8192,
        measure_runs=0,
    )


@spec("policy/default-balanced")
def test_the_default_policy_is_balanced():
    assert parse().engine_options.policy_config() == PolicyConfig()


@spec("policy/alpha-flag", "policy/terminal-overrides")
def test_policy_flags_override_after_the_preset():
    policy = parse(
        "--scheduler_policy=throughput",
        "--scheduler_terminal_value=0",
        "--scheduler_terminal_age_price=3",
        "--mtp_adaptive_verification_alpha=0.25",
    ).engine_options.policy_config()
    assert (policy.delivery_fairness, policy.decode_age_price) == (0, 0)
    assert (policy.terminal_value, policy.terminal_age_price, policy.adaptive_verification_alpha) == (
        0,
        3,
        0.25,
    )


@spec("policy/terminal-validation", "policy/alpha-validation")
@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("mtp_adaptive_verification_alpha", "0", "finite and greater than zero"),
        ("mtp_adaptive_verification_alpha", "-1", "finite and greater than zero"),
        ("mtp_adaptive_verification_alpha", "nan", "finite and greater than zero"),
        ("mtp_adaptive_verification_alpha", "inf", "finite and greater than zero"),
        ("scheduler_terminal_value", "-0.5", "finite and nonnegative"),
        ("scheduler_terminal_value", "inf", "finite and nonnegative"),
        ("scheduler_terminal_age_price", "nan", "finite and nonnegative"),
    ],
)
def test_policy_coefficients_are_validated(flag, value, message):
    with pytest.raises(ValueError, match=f"--{flag} must be {message}"):
        parse(f"--{flag}={value}")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--port=70000"], "--port must be 0..65535"),
        (["--concurrency=0"], "--concurrency must be 1..64"),
        (["--concurrency=65"], "--concurrency must be 1..64"),
        (["--draft_tokens=0"], "--draft_tokens must be at least 1 with --speculation=adaptive"),
        (["--prefill_chunks=64,x"], "--prefill_chunks must be a comma-separated list of integers"),
        (["--prefill_chunks=64,64"], "--prefill_chunks repeats a chunk size"),
        (["--prefill_chunks=0"], "--prefill_chunks must be >= 1"),
        (["--max_model_len=0"], "--max_model_len must be >= 1"),
        (
            ["--max_model_len=128", "--prefill_chunks=256"],
            "--prefill_chunks has a chunk longer than --max_model_len",
        ),
        (["--speculative_token_capacity=-1"], "--speculative_token_capacity must be >= 0"),
        (["--measure_runs=-1"], "--measure_runs must be >= 0"),
        (["--api_key= "], "--api_key must not be empty"),
        (["--fake_token_delay_ms=-1"], "--fake_token_delay_ms must be finite and nonnegative"),
    ],
)
def test_bad_values_name_the_flag(args, message):
    with pytest.raises(ValueError, match=message):
        parse(*args)


def test_enum_flags_reject_unknown_values():
    with pytest.raises(flags.IllegalFlagValueError):
        parse("--speculation=sometimes")
    with pytest.raises(flags.IllegalFlagValueError):
        parse("--engine=gpu")


def test_speculation_off_allows_zero_draft_tokens_and_builds_an_engine_config():
    options = parse(
        "--speculation=off", "--draft_tokens=0", "--concurrency=2", "--max_model_len=512"
    ).engine_options
    if importlib.util.find_spec("helios_jax.engine_config") is None:
        pytest.skip("helios_jax.engine_config is not present")
    config = options.engine_config()
    assert (config.request_slots, config.speculation, config.max_model_len) == (2, "off", 512)


def test_engine_factory_fake_uses_the_flags():
    engine = engine_factory(parse("--engine=fake", "--max_model_len=300", "--fake_token_delay_ms=2"))()
    assert isinstance(engine, FakeEngine)
    assert (engine.max_model_len, engine.token_delay_s) == (300, 0.002)


def test_unset_decode_steps_prepare_multi_step_programs_in_every_mode():
    assert parse("--speculation=off").engine_options.decode_steps == (1, 4, 8)
    assert parse("--speculation=off", "--decode_steps=1").engine_options.decode_steps == (1,)
    assert parse().engine_options.decode_steps == (1, 4, 8)  # adaptive: width-one rounds of K steps
    assert parse("--speculation=fixed", "--decode_steps=1,4").engine_options.decode_steps == (1, 4)
    config = parse(
        "--speculation=off", "--draft_tokens=0", "--max_model_len=512"
    ).engine_options.engine_config()
    assert config.decode_steps == (1, 4, 8)


def test_unset_prefill_batch_prepares_powers_of_four_up_to_the_concurrency():
    assert parse().engine_options.prefill_batch == (1, 4)  # --concurrency=4
    assert parse("--concurrency=2").engine_options.prefill_batch == (1,)
    assert parse("--concurrency=16").engine_options.prefill_batch == (1, 4, 16)
    assert parse("--concurrency=64").engine_options.prefill_batch == (1, 4, 16, 64)
    assert parse("--concurrency=16", "--prefill_batch=1").engine_options.prefill_batch == (1,)
    config = parse("--concurrency=16", "--max_model_len=512").engine_options.engine_config()
    assert config.prefill_batch == (1, 4, 16)


def test_mixed_prefill_flag_unset_is_none_and_explicit_values_pass_through():
    assert parse().engine_options.mixed_prefill is None
    assert parse("--mixed_prefill").engine_options.mixed_prefill is True
    assert parse("--nomixed_prefill").engine_options.mixed_prefill is False
    with pytest.raises(ValueError, match="--mixed_prefill must be true or false"):
        EngineOptions(mixed_prefill=1)


# A measured table that turns mixed programs on for one (platform, mode): the resolution must follow
# whatever the table says, for the resolved mode on the current platform.
MEASURED = {("cpu", "off"): True, ("cpu", "adaptive"): False}


def test_the_shipped_table_is_what_docs_serving_md_states():
    # measured off on a CPU in every mode; no GPU measurement yet
    assert engine_options.MIXED_PREFILL_DEFAULT == {
        ("cpu", "off"): False,
        ("cpu", "fixed"): False,
        ("cpu", "adaptive"): False,
    }


def test_mixed_prefill_default_reads_the_table_and_leaves_unmeasured_platforms_off(monkeypatch):
    monkeypatch.setattr(engine_options, "MIXED_PREFILL_DEFAULT", MEASURED)
    assert mixed_prefill_default("off", "cpu") is True
    assert mixed_prefill_default("adaptive", "cpu") is False
    assert mixed_prefill_default("fixed", "cpu") is False  # not in the table
    assert mixed_prefill_default("off", "gpu") is False  # not measured
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert mixed_prefill_default("off") is True  # the platform JAX computes on


def resolved_mixed(monkeypatch, platform, *args, model_config=None, **overrides):
    monkeypatch.setattr(engine_options, "MIXED_PREFILL_DEFAULT", MEASURED)
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    return parse(*args).engine_options.engine_config(model_config, **overrides).mixed_prefill


def test_unset_mixed_prefill_resolves_per_speculation_and_platform(monkeypatch):
    assert resolved_mixed(monkeypatch, "cpu", "--speculation=off") is True
    assert resolved_mixed(monkeypatch, "cpu", "--speculation=adaptive") is False
    assert resolved_mixed(monkeypatch, "gpu", "--speculation=off") is False
    # an explicit flag wins over the measured choice, either way
    assert resolved_mixed(monkeypatch, "cpu", "--speculation=off", "--nomixed_prefill") is False
    assert resolved_mixed(monkeypatch, "cpu", "--speculation=adaptive", "--mixed_prefill") is True
    assert resolved_mixed(monkeypatch, "cpu", "--speculation=off", mixed_prefill=False) is False


def test_unset_mixed_prefill_follows_the_speculation_the_model_allows(monkeypatch):
    # what engine_config reads of a model without a draft head (the real ModelConfig costs imports)
    no_head = types.SimpleNamespace(has_mtp=False, max_position_embeddings=256, dtype="float32")
    learned = ("--proposal_source=learned",)  # nothing drafts: decodes ordinarily
    assert parse(*learned).engine_options.engine_config(no_head).speculation == "off"
    assert resolved_mixed(monkeypatch, "cpu", *learned, model_config=no_head) is True
    assert resolved_mixed(monkeypatch, "cpu", model_config=no_head) is False  # copy proposals: adaptive


def test_unset_mixed_prefill_stays_off_without_an_aligned_prefill_chunk(monkeypatch):
    # a mixed prompt row needs a chunk that is a multiple of 64; the default must not break a config
    args = ("--speculation=off", "--prefill_chunks=48", "--max_model_len=256")
    assert resolved_mixed(monkeypatch, "cpu", *args) is False
    assert resolved_mixed(monkeypatch, "cpu", "--speculation=off", "--prefill_chunks=48,64") is True
    with pytest.raises(ValueError, match="mixed_prefill"):
        parse(*args, "--mixed_prefill").engine_options.engine_config()
