"""absl flags parse into a frozen ServerConfig; bad values fail naming the flag."""

import dataclasses
import importlib.util

import pytest
from absl import flags

from helios_jax.engine_options import EngineOptions
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


def test_unset_decode_steps_prepare_multi_step_programs_only_without_speculation():
    assert parse("--speculation=off").engine_options.decode_steps == (1, 4, 8)
    assert parse("--speculation=off", "--decode_steps=1").engine_options.decode_steps == (1,)
    assert parse().engine_options.decode_steps == (1,)  # adaptive speculation: single steps
    config = parse(
        "--speculation=off", "--draft_tokens=0", "--max_model_len=512"
    ).engine_options.engine_config()
    assert config.decode_steps == (1, 4, 8)
