"""rlagent.analysis.paired against independent references: brute-force enumeration of
k-subsets and bootstrap resamples, SciPy's permutation test and bootstrap, an exact
dynamic program over sign vectors, and hand cases."""

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats

from rlagent.analysis import paired


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_pass_estimators_equal_enumeration_of_k_subsets(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            assert paired.pass_at_k(n, c, k) == pytest.approx(np.mean([any(s) for s in subsets]))
            assert paired.pass_hat_k(n, c, k) == pytest.approx(np.mean([all(s) for s in subsets]))


def test_pass_hand_cases_and_refusals():
    assert paired.pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert paired.pass_at_k(10, 3, 8) == 1.0  # every 8-subset holds a success
    assert paired.pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert paired.pass_hat_k(4, 4, 3) == 1.0
    out = paired.per_task_pass(np.array([[1, 0, 0, 0], [1, 1, 1, 1]], bool), 2)
    np.testing.assert_allclose(out["pass@2"], [0.5, 1.0])
    np.testing.assert_allclose(out["pass^2"], [0.0, 1.0])
    with pytest.raises(ValueError, match="1 <= k <= n"):
        paired.pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c must be in"):
        paired.pass_hat_k(3, 5, 1)


def test_sign_flip_exact_equals_scipy_permutation_test():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=9), rng.normal(0.8, 1.0, size=9)
    reference = scipy_stats.permutation_test(
        (b, a), lambda x, y: np.mean(x - y), permutation_type="samples", n_resamples=np.inf
    )
    assert paired.sign_flip_test(a, b) == pytest.approx(reference.pvalue)


def _exact_integer_sign_flip(diff):
    """P(|sum of +-d_i| >= |sum d|) over all sign vectors, by a DP over integer sums."""
    counts = {0: 1}
    for d in diff:
        new = {}
        for total, ways in counts.items():
            for step in (d, -d):
                new[total + step] = new.get(total + step, 0) + ways
        counts = new
    observed = abs(sum(diff))
    return sum(w for t, w in counts.items() if abs(t) >= observed) / 2 ** len(diff)


def test_sign_flip_monte_carlo_matches_exact_dynamic_program():
    rng = np.random.default_rng(2)
    a = (rng.random(60) < 0.5).astype(int)  # binary successes of 60 tasks
    b = (rng.random(60) < 0.7).astype(int)
    diff = [int(x) for x in b - a if x]
    assert len(diff) > paired.EXACT_LIMIT  # the Monte-Carlo branch
    exact = _exact_integer_sign_flip(diff)
    assert 0.001 < exact < 0.5  # a case where the tail matters
    assert paired.sign_flip_test(a, b, draws=200_000) == pytest.approx(exact, abs=0.004)


def test_sign_flip_hand_cases():
    assert paired.sign_flip_test([0, 0, 0], [0, 0, 0]) == 1.0
    # Three tasks, all improved by 1: only the all-plus and all-minus vectors reach |3|/3.
    assert paired.sign_flip_test([0, 0, 0], [1, 1, 1]) == pytest.approx(2 / 8)


def test_paired_bootstrap_matches_exact_resampling_distribution():
    a, b = np.array([0.0, 0.5, 0.25, 1.0]), np.array([0.5, 0.5, 1.0, 0.75])
    diff = b - a
    # Every one of the 4^4 equally likely resamples of the tasks.
    means = [diff[list(idx)].mean() for idx in itertools.product(range(4), repeat=4)]
    low, high = np.percentile(means, [2.5, 97.5])
    out = paired.paired_bootstrap(a, b, reps=100_000)
    assert out["value"] == pytest.approx(diff.mean())
    assert out["low"] == pytest.approx(low, abs=0.02)
    assert out["high"] == pytest.approx(high, abs=0.02)


def test_paired_bootstrap_matches_scipy_paired_bootstrap():
    rng = np.random.default_rng(3)
    a = rng.random(50)
    b = a + rng.normal(0.1, 0.2, size=50)
    reference = scipy_stats.bootstrap(
        (b, a),
        lambda x, y: np.mean(x - y),
        paired=True,
        method="percentile",
        n_resamples=20_000,
        random_state=0,
    ).confidence_interval
    out = paired.paired_bootstrap(a, b, reps=20_000)
    assert out["low"] == pytest.approx(reference.low, abs=0.01)
    assert out["high"] == pytest.approx(reference.high, abs=0.01)


def test_pairing_narrows_the_interval_against_unpaired():
    rng = np.random.default_rng(4)
    difficulty = rng.random(60)  # shared by both arms: pairing removes it
    a, b = difficulty, difficulty + 0.05 + rng.normal(0, 0.02, 60)
    out = paired.paired_bootstrap(a, b)
    assert out["low"] > 0.03 and out["high"] < 0.07


def test_compare_and_verdict_lines():
    a, b = np.zeros(20), np.r_[np.ones(12), np.zeros(8)]
    better = paired.compare(a, b)
    assert better["a"] == 0.0 and better["b"] == 0.6 and better["tasks"] == 20
    assert better["a_interval"] == {"value": 0.0, "low": 0.0, "high": 0.0}
    assert 0.35 < better["b_interval"]["low"] < 0.6 < better["b_interval"]["high"] < 0.85
    assert better["p_value"] == pytest.approx(2 / 2**12)  # 12 nonzero differences
    line = paired.verdict("success", better)
    assert line.startswith("B better than A on success: +0.600 [")
    assert line.endswith("p = 0.000488")
    worse = paired.compare(a, b, higher_is_better=False)
    assert paired.verdict("violations", worse).startswith("B worse than A on violations")
    neutral = paired.compare(a, b, higher_is_better=None)
    assert paired.verdict("turns", neutral).startswith("B differs from A on turns: +0.600")
    same = paired.compare(a, np.r_[1.0, np.zeros(19)])
    line = paired.verdict("success", same)  # a non-rejection: no verdict, the power instead
    assert line.startswith("Cannot tell B from A on success: at 20 tasks (detectable +-")
    declared = paired.compare(a, np.r_[1.0, np.zeros(19)], margin=0.2)
    assert paired.verdict("success", declared).startswith("B equivalent within +-0.2 of A")
    with pytest.raises(ValueError, match="one length"):
        paired.compare([1.0, 2.0], [1.0])


def test_equivalence_test_is_two_one_sided_t_tests_by_hand():
    """TOST p = max of the two one-sided paired t-tests' p-values (Schuirmann 1987), from
    the t statistic written out; it rejects only when the interval sits inside the margin."""
    from scipy import stats as scipy_stats

    a = np.array([0.50, 0.60, 0.55, 0.70, 0.65, 0.40, 0.52, 0.58])
    b = a + np.array([0.02, -0.01, 0.03, 0.00, -0.02, 0.01, 0.02, -0.01])
    d = b - a
    se = d.std(ddof=1) / np.sqrt(d.size)
    for margin in (0.05, 0.01):
        p_low = scipy_stats.t.sf((d.mean() + margin) / se, d.size - 1)
        p_high = scipy_stats.t.cdf((d.mean() - margin) / se, d.size - 1)
        got = paired.equivalence_test(a, b, margin)
        assert got == pytest.approx(max(p_low, p_high), rel=1e-9)
    assert paired.equivalence_test(a, b, 0.05) < 0.001  # mean 0.005, sd 0.017: inside
    assert paired.equivalence_test(a, b, 0.01) > 0.05  # the interval crosses 0.01
    assert paired.equivalence_test(a, a + 0.02, 0.05) == 0.0  # no spread, inside
    assert paired.equivalence_test(a, a + 0.2, 0.05) == 1.0
    with pytest.raises(ValueError, match="margin must be > 0"):
        paired.equivalence_test(a, b, 0.0)


def test_detectable_difference_and_reading_words():
    d = np.array([0.3, -0.1, 0.2, 0.0, 0.1, -0.2, 0.4, 0.1, 0.0, 0.2])
    by_hand = (2.2621571627 + 0.8834038) * d.std(ddof=1) / np.sqrt(10)  # t(0.975, 9), t(0.8, 9)
    got = paired.detectable_difference(np.zeros(10), d)
    assert got == pytest.approx(by_hand, rel=1e-6)
    assert np.isnan(paired.detectable_difference([0.0], [1.0]))
    assert paired.reading(+0.2, 0.01, 10, got) == "B above A"
    assert paired.reading(-0.2, 0.01, 10, got) == "B below A"
    assert paired.reading(0.02, 0.4, 10, got, margin=0.1, equivalence_p=0.01) == (
        "equivalent within +-0.1"
    )
    cannot = paired.reading(0.02, 0.4, 10, got, margin=0.1, equivalence_p=0.2, unit="seeds")
    assert cannot == f"cannot tell at 10 seeds (detectable +-{got:.3g})"


def test_a_family_writes_its_readings():
    """Holm over the TOST p-values too; the table's last column is the reading."""
    seeds = range(12)
    base = {s: 0.5 + 0.01 * (s % 3) for s in seeds}
    far = {s: v + 0.3 + 0.01 * (s % 2) for s, v in base.items()}
    near = {s: v + 0.005 * (-1) ** s for s, v in base.items()}
    family = paired.paired_family(
        [("a", "far", base, far), ("a", "near", base, near)], reps=500, draws=2000, margin=0.05
    )
    assert [e["reading"] for e in family] == ["B above A", "equivalent within +-0.05"]
    assert family[1]["equivalence_p_holm"] >= family[1]["equivalence_p"]
    table = paired.families_markdown({"success": family}, {"success": "success"})
    assert "| reading |" in table and "equivalent within +-0.05 |" in table
