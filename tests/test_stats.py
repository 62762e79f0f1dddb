"""Statistics over seeds: hand cases and invariants of rlagent.analysis.stats (and the
metrics reader of rlagent.analysis.report that result scripts use)."""

import gzip

import numpy as np
import pytest

from rlagent.analysis import report
from rlagent.analysis import stats


def test_holm_hand_case():
    # Sorted p = .01, .02, .03, .04 with m = 4: 4*.01, 3*.02, 2*.03, 1*.04 -> running max.
    adjusted = stats.holm([0.03, 0.01, 0.04, 0.02])
    np.testing.assert_allclose(adjusted, [0.06, 0.04, 0.06, 0.06])
    np.testing.assert_allclose(stats.holm([0.5, 0.9]), [1.0, 1.0])


def test_holm_rejects_bad_p():
    with pytest.raises(ValueError, match="p_values"):
        stats.holm([0.1, 1.5])


def test_takeoff_rate_clopper_pearson_closed_forms():
    # k = 0: upper bound 1 - (alpha/2)^(1/n); k = n: lower bound (alpha/2)^(1/n).
    none = stats.takeoff_rate([0.0, 0.1, 0.2, 0.0, 0.3], threshold=0.5)
    assert none["k"] == 0 and none["low"] == 0.0
    np.testing.assert_allclose(none["high"], 1 - 0.025 ** (1 / 5), rtol=1e-9)
    every = stats.takeoff_rate([0.9] * 5, threshold=0.5)
    assert every["rate"] == 1.0 and every["high"] == 1.0
    np.testing.assert_allclose(every["low"], 0.025 ** (1 / 5), rtol=1e-9)
    half = stats.takeoff_rate([1, 0, 1, 0], threshold=0.5)
    assert half["low"] < 0.5 < half["high"] and half["rate"] == 0.5


def test_interval_estimates_iqm_and_mean():
    scores = {"a": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], "b": [1.0] * 8}
    out = stats.interval_estimates(scores, reps=200)
    # IQM of 8 values: the mean of the middle 4 (0.2 .. 0.5).
    np.testing.assert_allclose(out["a"]["iqm"]["value"], 0.35)
    np.testing.assert_allclose(out["a"]["mean"]["value"], 0.35)
    assert out["a"]["mean"]["low"] < 0.35 < out["a"]["mean"]["high"]
    assert out["b"]["iqm"] == {"value": 1.0, "low": 1.0, "high": 1.0}
    again = stats.interval_estimates(scores, reps=200)
    assert again == out  # seeded bootstrap


def test_iqm_is_rliables_to_the_bit():
    from rliable import metrics

    rng = np.random.default_rng(0)
    for size in range(1, 30):
        scores = rng.normal(size=(size, 1)) * 10 ** rng.uniform(-3, 3)
        scores[: size // 3] = scores[0]  # ties
        assert stats.iqm(scores) == metrics.aggregate_iqm(scores)


def test_pairwise_comparisons_separated_and_identical():
    scores = {"hi": [0.9, 0.8, 0.95, 0.85, 0.9, 0.99], "lo": [0.1, 0.0, 0.2, 0.1, 0.05, 0.15]}
    scores["same"] = list(scores["lo"])
    results = {(r["x"], r["y"]): r for r in stats.pairwise_comparisons(scores)}
    assert results[("hi", "lo")]["prob_improvement"] == 1.0
    assert results[("hi", "lo")]["p_value"] < 0.01 and results[("hi", "lo")]["significant"]
    assert results[("lo", "same")]["prob_improvement"] == 0.5
    assert results[("lo", "same")]["p_value"] == 1.0 and not results[("lo", "same")]["significant"]
    for r in results.values():
        assert r["p_holm"] >= r["p_value"]


def test_area_under_curve_step_function():
    # success 0 until 10 turns, then 1 from 10 to 20, then 0.5 until the budget 40.
    auc = stats.area_under_curve([0.0, 1.0, 0.5], [5.0, 10.0, 20.0], budget=40.0)
    np.testing.assert_allclose(auc, (10 * 1.0 + 20 * 0.5) / 40)
    assert stats.area_under_curve([1.0], [0.0], budget=3.0) == 1.0
    # Measurements past the budget do not count.
    np.testing.assert_allclose(stats.area_under_curve([1.0, 0.0], [0.0, 50.0], budget=10.0), 1.0)


def test_time_to_threshold_censors_unreached_seeds():
    assert stats.time_to_threshold([0.1, 0.6, 0.9], [10, 20, 30], 0.5, budget=30) == (20.0, True)
    assert stats.time_to_threshold([0.1, 0.2], [10, 20], 0.5, budget=30) == (30.0, False)
    summary = stats.censored_summary([10.0, 20.0, 30.0], [True, True, False])
    assert summary["median"] == 20.0 and summary["reached"] == "2/3"
    assert stats.censored_summary([10.0, 30.0, 30.0], [True, False, False])["median"] is None


def test_bad_curves_are_rejected():
    with pytest.raises(ValueError, match="experience"):
        stats.area_under_curve([0.0, 1.0], [10.0, 5.0], budget=20.0)
    with pytest.raises(ValueError, match="budget"):
        stats.area_under_curve([0.0], [1.0], budget=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        stats.interval_estimates({"a": [np.nan, 1.0]})


def test_performance_profile_plot(tmp_path):
    path = tmp_path / "profiles.png"
    scores = {"a": [0.1, 0.5, 0.9], "b": [0.0, 0.2, 1.0]}
    stats.plot_performance_profiles(scores, str(path), reps=50)
    assert path.stat().st_size > 1000


def test_mean_ci_student_t():
    # n = 3, std 0.01: t_{0.975, 2} = 4.303.
    out = stats.mean_ci([0.50, 0.51, 0.52])
    np.testing.assert_allclose(out["mean"], 0.51)
    np.testing.assert_allclose(out["ci95"], 4.3027 * 0.01 / np.sqrt(3), rtol=1e-4)
    assert stats.mean_ci([0.3]) == {"mean": 0.3, "std": 0.0, "ci95": 0.0}


def test_bootstrap_reps_default_environment_and_errors(monkeypatch):
    assert stats.bootstrap_reps(7) == 7  # an explicit number wins.
    monkeypatch.delenv(stats.REPS_ENV, raising=False)
    assert stats.bootstrap_reps() == stats.DEFAULT_REPS == 2000
    monkeypatch.setenv(stats.REPS_ENV, "50")
    assert stats.bootstrap_reps() == 50
    scores = {"a": [0.1, 0.4, 0.5, 0.9]}
    # The default is the environment's: the same intervals as asking for 50 resamples.
    assert stats.interval_estimates(scores) == stats.interval_estimates(scores, reps=50)
    assert stats.interval_estimates(scores) != stats.interval_estimates(scores, reps=400)
    monkeypatch.setenv(stats.REPS_ENV, "many")
    with pytest.raises(ValueError, match="RLAGENT_BOOTSTRAP_REPS='many'"):
        stats.bootstrap_reps()
    monkeypatch.setenv(stats.REPS_ENV, "0")
    with pytest.raises(ValueError, match="RLAGENT_BOOTSTRAP_REPS=0"):
        stats.bootstrap_reps()
    with pytest.raises(ValueError, match="reps=-1"):
        stats.interval_estimates(scores, reps=-1)


def test_last_evaluation_reads_the_last_evaluated_update_plain_or_gzipped(tmp_path):
    header = "condition,update,seed,success,eval_sampled_success\n"
    lines = ["a,1,0,0.1,0.2", "a,1,1,0.3,nan", "a,2,0,0.5,", "b,2,0,0.4,0.6", "b,2,1,0.7,0.8",
             "a,2,1,0.9,0.0", "a,3,0,1.0,"]  # fmt: skip
    text = header + "\n".join(lines) + "\n"
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "metrics.csv").write_text(text)
    (tmp_path / "zipped").mkdir()
    with gzip.open(tmp_path / "zipped" / "metrics.csv.gz", "wt") as f:
        f.write(text)
    for folder in ("plain", "zipped"):
        update, rows = report.last_evaluation(str(tmp_path / folder))
        assert update == 2 and sorted(rows) == ["a", "b"]
        assert sorted(rows["b"]) == [0, 1] and rows["b"][1]["eval_sampled_success"] == 0.8
        assert list(rows["a"]) == [1] and rows["a"][1]["success"] == 0.9
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "metrics.csv").write_text(header + "a,1,0,0.1,\n")
    with pytest.raises(ValueError, match="no row has an evaluation"):
        report.last_evaluation(str(tmp_path / "none"))


def test_write_analysis_writes_analysis_md_in_the_folder_and_prints_it(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    out = report.write_analysis(str(tmp_path / "results"), ["# title", "", "| a |"])
    assert out == str(tmp_path / "results" / "analysis.md")
    assert (tmp_path / "results" / "analysis.md").read_text() == "# title\n\n| a |\n"
    assert capsys.readouterr().out == "# title\n\n| a |\n"
