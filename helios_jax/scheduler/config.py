"""Policy preferences (spec, "Policy preferences").

The weights express a throughput/cadence tradeoff. They are not graph timings or latency
guarantees: setting a fairness or age coefficient to zero removes that preference, and
intrinsic throughput alone does not ensure starvation freedom.
"""

from __future__ import annotations

import dataclasses
import math

POLICY_PRESETS = ("balanced", "throughput")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    output_token_value: float = 64.0  # beta: prompt-value units per output token
    token_fairness: float = 16.0  # f: token-rate log-utility coefficient, value/ms
    delivery_fairness: float = 4.0  # g: delivery-rate log-utility coefficient, value/ms
    decode_age_price: float = 0.1  # c for decoders: linear output-age cost, value/ms^2
    terminal_value: float = 256.0  # value per terminal retirement, prompt-token units
    terminal_age_price: float = 1.0  # c for terminal rows: linear terminal-wait cost, value/ms^2
    adaptation_ms: float = 100.0  # tau: service-price adaptation time
    estimate_ttl_ns: int = 30_000_000_000  # timing freshness interval
    adaptive_verification_alpha: float = 1.0  # exponent on prefix-survival estimates
    checkpoint_extra_work_fraction: float = 0.05  # scheduler_checkpoint_extra_work_fraction

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"PolicyConfig.{field.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"PolicyConfig.{field.name} must be finite and nonnegative, got {value!r}")
        if self.adaptive_verification_alpha <= 0:
            raise ValueError(
                "PolicyConfig.adaptive_verification_alpha must be finite and greater than zero, "
                f"got {self.adaptive_verification_alpha!r}"
            )
        if self.adaptation_ms <= 0:
            raise ValueError(f"PolicyConfig.adaptation_ms must be positive, got {self.adaptation_ms!r}")
        if self.estimate_ttl_ns <= 0:
            raise ValueError(f"PolicyConfig.estimate_ttl_ns must be positive, got {self.estimate_ttl_ns!r}")
        if self.checkpoint_extra_work_fraction >= 1:
            raise ValueError("PolicyConfig.checkpoint_extra_work_fraction must be below one")

    @classmethod
    def preset(
        cls,
        name: str = "balanced",
        *,
        terminal_value: float | None = None,
        terminal_age_price: float | None = None,
        adaptive_verification_alpha: float | None = None,
    ) -> PolicyConfig:
        """A named preset, then the terminal and alpha overrides (as the CLI flags apply them).

        ``balanced`` uses the defaults. ``throughput`` keeps token fairness and output-token
        value and sets delivery fairness and decode-age price to zero; it changes preferences
        only, never captured capacities or sampling. Terminal overrides apply after the preset
        under both policies.
        """
        if name == "balanced":
            config = cls()
        elif name == "throughput":
            config = cls(delivery_fairness=0.0, decode_age_price=0.0)
        else:
            raise ValueError(f"unknown scheduler policy {name!r}; choose one of {POLICY_PRESETS}")
        value = config.terminal_value if terminal_value is None else terminal_value
        age_price = config.terminal_age_price if terminal_age_price is None else terminal_age_price
        alpha = (
            config.adaptive_verification_alpha
            if adaptive_verification_alpha is None
            else adaptive_verification_alpha
        )
        return dataclasses.replace(
            config, terminal_value=value, terminal_age_price=age_price, adaptive_verification_alpha=alpha
        )
