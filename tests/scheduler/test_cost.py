"""Duration estimates: indeterminate start, first sample, median of nine, staleness."""

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helios_jax.catalog import GraphKind, shipped_catalog
from helios_jax.scheduler.cost import CostModel, cost_sample, median, raw_device_interval

spec = pytest.mark.spec
KEY = shipped_catalog().graphs[0].key
TTL = 30_000_000_000


@spec("duration-estimates/start-zero", "duration-estimates/zero-indeterminate")
def test_estimates_start_indeterminate_whatever_the_descriptor_says():
    cat = shipped_catalog()
    assert cat.graphs[0].duration_ms == 4.854
    costs = CostModel()
    assert costs.estimate_ns(KEY) == 0 and not costs.is_known(KEY) and costs.estimate_ms(KEY) is None


@spec("duration-estimates/first-sets", "duration-estimates/median-of-nine", "duration-estimates/even-median")
def test_first_sets_then_median_of_last_nine():
    costs = CostModel()
    costs.observe(KEY, [10.0], 0)
    assert costs.estimate_ns(KEY) == 10.0
    costs.observe(KEY, [20.0], 1)
    assert costs.estimate_ns(KEY) == 15.0  # even count: middle pair averaged
    costs.observe(KEY, [100.0], 2)
    assert costs.estimate_ns(KEY) == 20.0
    for i, x in enumerate([1, 2, 3, 4, 5, 6, 7, 8, 9]):
        costs.observe(KEY, [float(x)], 3 + i)
    assert costs.samples(KEY) == tuple(float(x) for x in range(1, 10))  # only the last nine
    assert costs.estimate_ns(KEY) == 5.0


@spec(
    "duration-estimates/stale-30s",
    "duration-estimates/stale-usable",
    "duration-estimates/stale-replace",
    "duration-estimates/never-unknown-by-time",
)
def test_staleness_keeps_cost_and_first_new_sample_replaces():
    costs = CostModel(TTL)
    for x in (10.0, 12.0, 14.0):
        costs.observe(KEY, [x], 0)
    assert not costs.is_stale(KEY, TTL)
    assert costs.is_stale(KEY, TTL + 1)
    assert costs.estimate_ns(KEY) == 12.0 and costs.is_known(KEY)  # still usable when stale
    assert costs.is_known(KEY) and costs.is_stale(KEY, 10**15)  # time alone never unknowns it
    costs.observe(KEY, [40.0], TTL + 1)
    assert costs.estimate_ns(KEY) == 40.0 and costs.samples(KEY) == (40.0,)
    assert not costs.is_stale(KEY, TTL + 2)


@spec(
    "duration-estimates/raw-max-rank",
    "duration-estimates/readiness-correction",
    "confidence-acceptance/cost-full-graph",
    "acceptance-learning/estimates-corrected",
)
def test_sample_is_max_positive_rank_interval_less_readiness():
    assert cost_sample([3.0, 7.0, 0.0, -1.0]) == 7.0
    assert raw_device_interval([-5.0, None, 0.0]) == 0.0  # no rank reported a positive interval
    assert cost_sample([3.0, 7.0], readiness_delay_ns=2.0) == 5.0  # after aggregating ranks
    assert cost_sample([3.0, 7.0], readiness_delay_ns=9.0) == 0.0  # all readiness stall: no valid sample
    costs = CostModel()
    costs.observe(KEY, [5.0, 9.0], 0, readiness_delay_ns=4.0)
    assert costs.estimate_ns(KEY) == 5.0


@spec("duration-estimates/missing-zero-ignored")
def test_missing_or_zero_intervals_change_nothing():
    costs = CostModel(TTL)
    assert not costs.observe(KEY, [], 0) and not costs.observe(KEY, [0.0, 0.0], 0)
    assert not costs.is_known(KEY)
    costs.observe(KEY, [10.0], 0)
    assert not costs.observe(KEY, [0.0], TTL + 5)
    assert costs.estimate_ns(KEY) == 10.0 and costs.is_stale(KEY, TTL + 5)  # not made fresh


@spec("duration-estimates/rows-not-key", "duration-estimates/cost-key", "mixed-execution/duration-key")
def test_entries_are_keyed_by_physical_shape():
    cat = shipped_catalog()
    mixed = cat.of_kind(GraphKind.MIXED)
    costs = CostModel()
    costs.observe(mixed[0].key, [1.0], 0)
    assert costs.is_known(mixed[0].key)
    assert not any(costs.is_known(g.key) for g in mixed[1:])
    assert len({g.key for g in cat.graphs}) == len(cat.graphs)


def test_seeding_goes_through_observation():
    cat = shipped_catalog()
    costs = CostModel()
    assert costs.seed_from_catalog(cat, 0) == len(cat.graphs)
    assert costs.estimate_ms(cat.graphs[0].key) == pytest.approx(4.854)


@given(st.lists(st.floats(min_value=1.0, max_value=1e9), min_size=1, max_size=40))
def test_fresh_estimate_is_median_of_last_nine(samples):
    costs = CostModel()
    for i, x in enumerate(samples):
        costs.observe(KEY, [x], i)
    assert costs.estimate_ns(KEY) == pytest.approx(median(samples[-9:]))
    assert min(samples[-9:]) <= costs.estimate_ns(KEY) <= max(samples[-9:])


def test_median_of_no_samples_is_an_error():
    with pytest.raises(ValueError):
        median([])


@spec(
    "timing-refresh/alternative-order",
    "timing-refresh/attempt-on-commit",
    "duration-estimates/zero-indeterminate",
)
def test_queries_on_unmeasured_and_attempted_entries():
    costs = CostModel(TTL)
    other = shipped_catalog().graphs[1].key
    assert costs.last_attempt_ns(KEY) is None and costs.last_valid_ns(KEY) is None
    assert costs.samples(KEY) == () and costs.refresh_order_ns(KEY) == -1
    assert costs.observation_age_ns(KEY, 10) is None
    assert not costs.is_stale(KEY, 10**15)  # unknown, not stale: only a measured entry goes stale
    costs.note_attempt(other, 0)
    assert costs.refresh_order_ns(other) == 0  # an attempt at time zero is later than no attempt
    costs.note_attempt(KEY, 50)  # a committed dispatch without a valid observation yet
    assert costs.last_attempt_ns(KEY) == 50 and costs.refresh_order_ns(KEY) == 50
    assert costs.keys() == () and not costs.is_known(KEY)  # attempts alone measure nothing
    costs.observe(KEY, [0.5], 70)  # half a nanosecond is still a measurement, and goes stale
    assert costs.estimate_ms(KEY) == 0.5e-6
    assert costs.is_fresh(KEY, 70 + TTL) and costs.is_stale(KEY, 71 + TTL)
    costs.observe(KEY, [1.5], 71)
    assert costs.estimate_ns(KEY) == 1.0  # the median of both: 0.5 ns was an estimate, not "unknown"
    costs.observe(other, [3.0], 20)
    assert set(costs.keys()) == {KEY, other}
    assert costs.refresh_order_ns(KEY) == 71 and costs.refresh_order_ns(other) == 20
    assert costs.observation_age_ns(KEY, 100) == 29
    third = shipped_catalog().graphs[2].key
    costs.observe(third, [2_000_000.0], 20)
    assert costs.estimate_ms(third) == 2.0  # ns to ms, exactly


def test_snapshot_is_a_deep_copy_that_restore_brings_back():
    costs = CostModel(TTL)
    costs.observe(KEY, [10.0], 0)
    snap = costs.snapshot()
    for x in (20.0, 30.0):
        costs.observe(KEY, [x], 1)
    assert snap[KEY].samples == collections.deque([10.0]) and snap[KEY].estimate_ns == 10.0
    version = costs.version
    costs.restore(snap)
    assert costs.estimate_ns(KEY) == 10.0 and costs.samples(KEY) == (10.0,)
    assert costs.version > version  # a restore changes estimates: a version not seen before
    for i in range(12):
        costs.observe(KEY, [float(i)], 2)
    assert len(costs.samples(KEY)) == 9  # the restored window keeps its nine-sample bound


@spec("duration-estimates/stale-30s")
def test_the_default_freshness_interval_is_thirty_seconds_and_must_be_positive():
    costs = CostModel()
    costs.observe(KEY, [10.0], 0)
    assert not costs.is_stale(KEY, 30_000_000_000) and costs.is_stale(KEY, 30_000_000_001)
    assert CostModel(1).ttl_ns == 1
    for ttl in (0, -1):
        with pytest.raises(ValueError):
            CostModel(ttl)


def test_every_estimate_change_bumps_the_version():
    costs = CostModel(TTL)
    seen = [costs.version]
    for x in (10.0, 20.0, 0.0, 30.0):
        costs.observe(KEY, [x], 0)
        seen.append(costs.version)
    assert seen[1] > seen[0] and seen[2] > seen[1] and seen[3] == seen[2] and seen[4] > seen[3]


def test_an_unchanged_estimate_keeps_the_version():
    """Readers cache per version (normalizers, durations): a sample that leaves the median where
    it was changes no estimate, so it keeps the version; one that moves it bumps it."""
    costs = CostModel(TTL)
    costs.observe(KEY, [10.0], 0)
    costs.observe(KEY, [20.0], 0)  # median 15
    version = costs.version
    costs.observe(KEY, [15.0], 0)  # median of 10, 15, 20: still 15
    assert costs.estimate_ns(KEY) == 15.0 and costs.version == version
    costs.observe(KEY, [30.0], 0)  # median of four: 17.5
    assert costs.estimate_ns(KEY) == 17.5 and costs.version > version


def test_any_stale_agrees_with_is_stale_as_observations_and_time_move():
    """any_stale keeps the oldest valid observation per program sequence; a new observation, a
    restore or the clock must still move it exactly as is_stale over every program would."""
    programs = shipped_catalog().graphs[:3]
    costs = CostModel(ttl_ns=100)

    def agrees(now):
        want = any(costs.is_stale(g.key, now) for g in programs)
        assert costs.any_stale(programs, now) is want
        return want

    assert not agrees(10**6)  # nothing measured: never stale
    costs.note_attempt(programs[0].key, 0)  # an attempt measures nothing
    assert not agrees(10**6)
    costs.observe(programs[0].key, [5.0], 0)
    costs.observe(programs[1].key, [5.0], 50)
    assert not agrees(100) and agrees(101)  # strictly older than the interval
    snap = costs.snapshot()
    costs.observe(programs[0].key, [6.0], 120)  # the oldest is renewed: programs[1]'s decides
    assert not agrees(150) and agrees(151)
    costs.observe(programs[1].key, [5.0], 151)  # the same estimate: no version bump, fresh again
    assert not agrees(151) and not agrees(220) and agrees(221)
    costs.observe(programs[1].key, [5.0], 160)  # not the oldest: the kept oldest still holds
    assert not agrees(220) and agrees(221)
    costs.observe(programs[2].key, [5.0], 110)  # a first measurement, older than the oldest
    assert not agrees(210) and agrees(211)
    costs.observe(programs[1].key, [5.0], 100)  # a clock that moved back: an older stamp
    assert not agrees(200) and agrees(201)
    costs.restore(snap)
    assert agrees(101)
    assert costs.any_stale(programs[1:], 101) is False  # another sequence: its own oldest
    other = CostModel(ttl_ns=100)
    other.observe(programs[0].key, [5.0], 0)
    assert other.any_stale(programs[1:], 500) is False  # none of them measured
    other.observe(programs[0].key, [5.0], 10)
    other.observe(programs[1].key, [5.0], 20)
    assert other.any_stale(programs[1:], 121) is True


def test_changed_since_names_the_changed_keys_or_admits_it_does_not_know():
    """CostModel.changed_since: the keys whose estimate changed after a version (an unchanged
    median is no change), None after a restore or past what the log keeps."""
    from helios_jax.scheduler.cost import CHANGE_LOG

    graphs = shipped_catalog().graphs
    a, b, c = graphs[0].key, graphs[1].key, graphs[2].key
    costs = CostModel()
    v0 = costs.version
    assert costs.changed_since(v0) == set()
    costs.observe(a, [10.0], 0)
    costs.observe(b, [10.0], 0)
    v1 = costs.version
    assert costs.changed_since(v0) == {a, b} and costs.changed_since(v1 - 1) == {b}
    costs.observe(a, [10.0], 1)  # the median stays 10: no change, no version
    assert costs.version == v1 and costs.changed_since(v1) == set()
    costs.observe(c, [5.0], 2)
    assert costs.changed_since(v1) == {c} and costs.changed_since(v0) == {a, b, c}
    snap = costs.snapshot()
    costs.restore(snap)  # every entry replaced: which changed is not known
    assert costs.changed_since(v1) is None and costs.changed_since(costs.version) == set()
    v2 = costs.version
    for i in range(CHANGE_LOG + 1):  # each past the freshness interval: it replaces the estimate
        costs.observe(a, [float(1000 + i)], (i + 1) * (TTL + 10))
    assert costs.changed_since(v2) is None  # more changes than the log keeps
    assert costs.changed_since(costs.version - CHANGE_LOG) == {a}


def test_kept_durations_follow_the_changed_estimates_and_read_only_those():
    """PreparedGraphs.durations after changes equals every estimate read again, whatever the
    sequence of observations, stale re-measurements and restores; after a few changes it reads
    only the changed keys' estimates (and hands out a new table, the old one unchanged)."""
    import random

    from helios_jax.catalog import DecodeMode
    from helios_jax.scheduler.policy.prepared import PreparedGraphs

    loaded = shipped_catalog().eligible(DecodeMode.ADAPTIVE)
    prepared = PreparedGraphs(loaded[: len(loaded) // 2])  # half: some changed keys load nothing
    keys = sorted({g.key for g in loaded})
    costs, rng, now = CostModel(), random.Random(7), 0
    for step in range(400):
        now += rng.choice([1, 10, TTL // 3])  # sometimes past the freshness interval
        if rng.random() < 0.03:
            costs.restore(costs.snapshot())
        else:
            costs.observe(rng.choice(keys), [rng.uniform(1e5, 9e6)], now)
        before = prepared._durations[2] if prepared._durations else None
        frozen = dict(before) if before is not None else None
        table = prepared.durations(costs)
        assert table == {id(g): costs.estimate_ms(g.key) for g in prepared.graphs}, step
        assert before is None or before == frozen  # a table handed out never changes
        assert prepared.durations(costs) is table  # kept while the version holds
    read = []
    real = costs.estimate_ms
    costs.estimate_ms = lambda key: read.append(key) or real(key)
    mine = sorted({g.key for g in prepared.graphs})
    costs.observe(mine[0], [1.0], now + 1)  # a sample far below: the median moves
    costs.observe(mine[1], [1.0], now + 1)
    prepared.durations(costs)
    assert set(read) == {mine[0], mine[1]}


@spec("duration-estimates/first-sets", "duration-estimates/stale-30s")
def test_an_estimate_of_one_nanosecond_is_measured_and_goes_stale():
    """Any positive observation sets the estimate (here 1 ns, the smallest integer one), and
    such an entry then ages like any other: stale for any_stale as for is_stale."""
    (g,) = shipped_catalog().graphs[:1]
    costs = CostModel(ttl_ns=100)
    costs.observe(g.key, [1.0], 0)
    assert costs.is_known(g.key) and costs.estimate_ns(g.key) == 1.0
    assert not costs.any_stale([g], 100)
    assert costs.is_stale(g.key, 101) and costs.any_stale([g], 101)


def test_any_stale_reads_its_kept_oldest_only_at_the_epoch_it_was_kept():
    """The kept oldest is keyed by the observation epoch, whatever values the stamps take: here
    the kept oldest stamp (2 ns) equals the epoch after the next observation (2), which renews
    that stamp; any_stale must read the new one."""
    (g,) = shipped_catalog().graphs[:1]
    programs = [g]
    costs = CostModel(ttl_ns=100)
    costs.observe(g.key, [5.0], 2)  # epoch 1
    assert not costs.any_stale(programs, 50)  # kept: (programs, epoch 1, oldest 2)
    costs.observe(g.key, [5.0], 10)  # the same entry renewed: epoch 2
    assert not costs.is_stale(g.key, 103)
    assert costs.any_stale(programs, 103) is False  # 103 - 10 <= 100; the old stamp would say stale


def test_a_restore_never_leaves_any_stale_reading_an_oldest_kept_before_it():
    """A restore replaces every entry: whatever epochs passed since any_stale kept its oldest,
    the next call reads the restored entries (here none measured: never stale)."""
    (g,) = shipped_catalog().graphs[:1]
    programs = [g]
    for observations_after in (0, 1):  # the restore directly after keeping, or one epoch later
        costs = CostModel(ttl_ns=100)
        empty = costs.snapshot()
        costs.observe(g.key, [5.0], 100)  # epoch 1
        assert not costs.any_stale(programs, 150)  # kept at epoch 1
        for i in range(observations_after):
            costs.observe(g.key, [5.0], 120 + i)  # epoch 2: kept not read since
        costs.restore(empty)
        assert not costs.is_known(g.key)
        assert costs.any_stale(programs, 100 + 101) is False
