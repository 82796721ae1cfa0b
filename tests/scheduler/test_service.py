"""Service prices: gradients, the entropy-dual update and missing histories.

Expected values are derived by hand in each docstring.
"""

import math

import pytest

from helios_jax.catalog import DecodeMode, shipped_catalog
from helios_jax.scheduler import service
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.core import Scheduler
from helios_jax.scheduler.cost import CostModel

spec = pytest.mark.spec
P = PolicyConfig()


@spec("useful-service/prefill-price", "useful-service/output-price", "useful-service/delivery-price")
def test_prices_are_utility_gradients():
    """x = 2 tokens/ms, z = 0.05 deliveries/ms: 1 + 16/2 = 9, 64 + 8 = 72, 4/0.05 = 80."""
    p = service.log_prices(P, math.log(2.0), math.log(0.05))
    assert math.exp(p.prefill_token) == pytest.approx(9.0)
    assert math.exp(p.output_token) == pytest.approx(72.0)
    assert math.exp(p.delivery) == pytest.approx(80.0)


@spec("useful-service/decoders-only-delivery")
def test_no_delivery_coordinate_without_history():
    assert service.log_prices(P, 0.0, None).delivery == -math.inf


@spec("useful-service/entropy-dual", "service-accounting/unselected-zero")
def test_rate_update_sequence():
    """tau = 100 ms, dt = 10 ms: a = exp(-0.1) = 0.904837.

    x0 = 2: served 30 tokens -> 0.904837*2 + 0.095163*3 = 2.095163;
    then unserved for 10 ms  -> 0.904837*2.095163 = 1.895781 (price 1 + 16/x rises from 8.64 to 9.44).
    """
    h = service.ServiceHistory(log_x=math.log(2.0))
    service.update_token_history(h, 30, 10.0, P, prior_log_x=0.0)
    assert math.exp(h.log_x) == pytest.approx(2.095163, rel=1e-6)
    service.update_token_history(h, 0, 10.0, P, prior_log_x=0.0)
    assert math.exp(h.log_x) == pytest.approx(1.895781, rel=1e-6)
    assert math.exp(service.log_prices(P, h.log_x, None).prefill_token) == pytest.approx(1 + 16 / 1.895781)


def test_long_starvation_stays_representable():
    """An hour unserved: log x falls by 36000 and the price is still an ordinary float log."""
    log_x = service.decayed_log_rate(0.0, 0, 3_600_000.0, 100.0)
    assert log_x == pytest.approx(-36000.0)
    assert math.isfinite(service.log_prices(P, log_x, None).prefill_token)


@spec("policy/zero-removes")
def test_zero_fairness_removes_the_rate_term():
    p = service.log_prices(PolicyConfig(token_fairness=0, delivery_fairness=0), -50.0, -50.0)
    assert math.exp(p.prefill_token) == 1.0 and math.exp(p.output_token) == pytest.approx(64.0)
    assert p.delivery == -math.inf


@spec(
    "service-accounting/first-burst-history", "useful-service/sigma-fastest", "useful-service/sigma-formula"
)
def test_missing_histories():
    """Token: never better served than its share 1/sigma(K) of the fastest batch-feasible
    generation rate or the worst-served resident, decaying from admission; it stays missing
    while unserved. Delivery: one delivery over the first burst's frame."""
    costs = CostModel()
    cat = shipped_catalog()
    costs.seed_from_catalog(cat, 0)
    norm = service.Normalizers.measure(cat.eligible(DecodeMode.ADAPTIVE), costs)
    # Four streams: the width-one B=4 program (3.674 ms) serves all four fastest; the B=16 one
    # (4.046 ms) would deliver 16 per round only with 16 streams, which K = 4 cannot reach.
    assert service.batch_feasible_interval(4, norm.generation) == pytest.approx(4 * 3.674 / 4)
    share = -math.log(3.674)
    assert norm.share_log_rate(4) == pytest.approx(share)
    # One stream: the B=1 width-one program, 3.581 ms; sixteen: the B=16 one, 16 * 4.046 / 16.
    assert norm.share_log_rate(1) == pytest.approx(-math.log(3.581))
    assert norm.share_log_rate(16) == pytest.approx(-math.log(4.046))
    assert service.missing_log_token_rate(norm, 4, [], 0.0, 100.0) == pytest.approx(share)
    assert service.missing_log_token_rate(norm, 4, [None, -3.0], 0.0, 100.0) == pytest.approx(
        min(share, -3.0)
    )
    assert service.missing_log_token_rate(norm, 4, [], 50.0, 100.0) == pytest.approx(share - 0.5)
    cold = service.Normalizers.measure(cat.graphs, CostModel())
    assert cold.share_log_rate(4) == pytest.approx(math.log(service.COLD_RATE / 4))
    h = service.ServiceHistory()
    service.update_token_history(h, 0, 10.0, P, prior_log_x=share)
    assert h.log_x is None  # unserved: still missing, its wait is priced by the decay
    service.update_token_history(h, 64, 10.0, P, prior_log_x=share)
    assert math.exp(h.log_x) == pytest.approx(math.exp(share) * math.exp(-0.1) + (1 - math.exp(-0.1)) * 6.4)
    assert service.delivery_update(None, 0, 10.0, P) is None
    assert math.exp(service.first_delivery_log_rate(8.0)) == pytest.approx(1 / 8)


@spec("useful-service/sigma-fastest")
def test_waiting_prompts_are_priced_at_a_batch_feasible_share():
    """Two resident prompts are priced at 1/sigma(2) each: the B=2 width-one program's 3.612 ms
    for two streams, not the B=16 program's 16 deliveries per 4.046 ms that two streams cannot
    use (an unreachable rate would make them look well served)."""
    s = Scheduler(shipped_catalog())
    s.seed_costs(0)
    s.admit([1] * 64, max_output=8)
    s.admit([1] * 64, max_output=8)
    x = 1 / 3.612
    for v in s.views():
        assert math.exp(v.log_prefill_price) == pytest.approx(1 + P.token_fairness / x)


def test_invalid_intervals():
    with pytest.raises(ValueError):
        service.decayed_log_rate(0.0, 1, 0.0, 100.0)
    with pytest.raises(ValueError):
        service.decayed_log_rate(0.0, -1, 1.0, 100.0)


@spec("useful-service/prefill-price", "useful-service/output-price")
def test_a_rate_equal_to_the_fairness_weight_doubles_the_prefill_price():
    """x = f = 16 tokens/ms: f/x = 1, so the prefill price is 1 + 1 = 2 (the two log terms are
    equal, log 2 exactly) and the output price 64 + 1 = 65."""
    p = service.log_prices(P, math.log(16.0), None)
    assert p.prefill_token == pytest.approx(math.log(2.0), abs=1e-15)
    assert math.exp(p.output_token) == pytest.approx(65.0)


@spec("useful-service/prefill-price", "useful-service/output-price", "useful-service/delivery-price")
def test_weights_of_one_or_less_still_price():
    """f = 1, beta = 1, g = 0.5 (weights at or below one are weights, not 'off'); x = 2, z = 0.25:
    prefill 1 + 1/2 = 1.5, output 1 + 1/2 = 1.5, delivery 0.5/0.25 = 2."""
    policy = PolicyConfig(token_fairness=1.0, output_token_value=1.0, delivery_fairness=0.5)
    p = service.log_prices(policy, math.log(2.0), math.log(0.25))
    assert math.exp(p.prefill_token) == pytest.approx(1.5)
    assert math.exp(p.output_token) == pytest.approx(1.5)
    assert math.exp(p.delivery) == pytest.approx(2.0)


@spec("useful-service/prefill-price", "useful-service/output-price")
def test_a_vanishing_fairness_weight_stays_representable():
    """f = 1e-320 (positive, legal): f/x = 5e-321 at x = 2, so the prices are 1 and 64 to double
    precision; the sum in log space must not overflow when one term is 737 e-folds below the
    other."""
    p = service.log_prices(PolicyConfig(token_fairness=1e-320), math.log(2.0), None)
    assert math.exp(p.prefill_token) == pytest.approx(1.0)
    assert math.exp(p.output_token) == pytest.approx(64.0)


@spec("useful-service/sigma-formula")
def test_sub_millisecond_programs_and_frames():
    """A B=4 program of 0.5 ms shared by K=2 streams: sigma = 2 * 0.5 / min(4, 2) = 0.5 ms, a share
    of 2 deliveries per ms each. A first burst over a 0.5 ms frame starts z at 1/0.5 = 2 per ms.
    No streams: no reference interval (0.0, as with no measured program)."""
    norm = service.Normalizers(((4, 0.5),))
    assert service.batch_feasible_interval(2, norm.generation) == pytest.approx(0.5)
    assert norm.share_log_rate(2) == pytest.approx(math.log(2.0))
    assert service.first_delivery_log_rate(0.5) == pytest.approx(math.log(2.0))
    assert service.batch_feasible_interval(0, norm.generation) == 0.0
    assert service.batch_feasible_interval(2, ()) == 0.0


def test_an_empty_interval_is_refused_even_without_service():
    with pytest.raises(ValueError, match="positive"):
        service.decayed_log_rate(0.0, 0, 0.0, 100.0)


@pytest.mark.parametrize(
    "policy",
    [
        PolicyConfig(),
        PolicyConfig(token_fairness=0.0, delivery_fairness=0.0),
        PolicyConfig(output_token_value=1),
    ],
)
def test_price_columns_are_each_requests_prices(policy):
    """`price_columns` (every resident of a decision at once, as views() prices them) gives each
    request exactly the prices `log_prices` gives it alone, a missing delivery coordinate -inf."""
    log_x = [-3.0, -0.5, 0.0, math.log(16.0), 2.5, -40.0, 700.0]
    log_z = [None, -2.0, 0.0, None, 1.5, -40.0, None]
    prefill, output, delivery = service.price_columns(service.price_terms(policy), log_x, log_z)
    for i, (x, z) in enumerate(zip(log_x, log_z)):
        alone = service.log_prices(policy, x, z)
        assert (prefill[i], output[i], delivery[i]) == (
            alone.prefill_token,
            alone.output_token,
            alone.delivery,
        )
        assert all(type(p) is float for p in (prefill[i], output[i], delivery[i]))
    assert service.price_columns(service.price_terms(policy), [], []) == ([], [], [])
