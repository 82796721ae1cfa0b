"""PolicyConfig defaults, presets, overrides and validation."""

import math

import pytest

from helios_jax.scheduler.config import PolicyConfig

spec = pytest.mark.spec


@spec(
    "policy/output-token-value",
    "policy/token-fairness",
    "policy/delivery-fairness",
    "policy/decode-age-price",
    "policy/terminal-value",
    "policy/terminal-age-price",
    "policy/adaptation-ms",
    "policy/estimate-ttl",
    "policy/alpha",
    "confidence-acceptance/alpha-default",
    "planning-queue/extra-fraction-default",
    "policy/default-balanced",
)
def test_defaults_are_the_spec_table():
    p = PolicyConfig.preset()
    assert (p.output_token_value, p.token_fairness, p.delivery_fairness, p.decode_age_price) == (
        64,
        16,
        4,
        0.1,
    )
    assert (p.terminal_value, p.terminal_age_price, p.adaptation_ms) == (256, 1, 100)
    assert p.estimate_ttl_ns == 30_000_000_000
    assert p.adaptive_verification_alpha == 1
    assert p.checkpoint_extra_work_fraction == 0.05
    assert p == PolicyConfig()


@spec("policy/throughput-preset", "policy/preset-scope", "prerequisites/terminal-both-policies")
def test_throughput_preset_zeroes_delivery_and_age_only():
    t = PolicyConfig.preset("throughput")
    assert (t.delivery_fairness, t.decode_age_price) == (0, 0)
    assert (t.token_fairness, t.output_token_value) == (16, 64)
    assert (t.terminal_value, t.terminal_age_price) == (256, 1)  # terminal urgency under both presets


@spec("policy/terminal-overrides", "policy/terminal-both-zero", "policy/alpha-flag")
def test_overrides_apply_after_the_preset():
    t = PolicyConfig.preset(
        "throughput", terminal_value=0, terminal_age_price=0, adaptive_verification_alpha=0.5
    )
    assert (t.terminal_value, t.terminal_age_price, t.adaptive_verification_alpha) == (0, 0, 0.5)
    assert t.delivery_fairness == 0


@spec("policy/terminal-validation", "policy/alpha-validation")
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(terminal_value=-1), "terminal_value"),
        (dict(terminal_age_price=math.inf), "terminal_age_price"),
        (dict(terminal_value=math.nan), "terminal_value"),
        (dict(adaptive_verification_alpha=0), "adaptive_verification_alpha"),
        (dict(adaptive_verification_alpha=math.inf), "adaptive_verification_alpha"),
    ],
)
def test_invalid_coefficients_are_rejected(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PolicyConfig.preset("balanced", **kwargs)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown scheduler policy 'fast'"):
        PolicyConfig.preset("fast")


@spec("policy/zero-removes")
def test_zero_coefficients_are_legal():
    p = PolicyConfig(token_fairness=0, delivery_fairness=0, decode_age_price=0)
    assert p.token_fairness == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(adaptation_ms=0), "adaptation_ms"),  # tau divides: positive, not merely nonnegative
        (dict(estimate_ttl_ns=0), "estimate_ttl_ns"),
        (dict(checkpoint_extra_work_fraction=1.0), "checkpoint_extra_work_fraction"),
        (dict(token_fairness=True), "token_fairness"),  # a flag is not a coefficient
        (dict(output_token_value="64"), "output_token_value"),
        (dict(decode_age_price=-0.1), "decode_age_price"),
    ],
)
def test_every_field_is_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PolicyConfig(**kwargs)


def test_positive_fields_accept_small_positive_values():
    p = PolicyConfig(adaptation_ms=0.5, estimate_ttl_ns=1, checkpoint_extra_work_fraction=0.999)
    assert (p.adaptation_ms, p.estimate_ttl_ns, p.checkpoint_extra_work_fraction) == (0.5, 1, 0.999)
