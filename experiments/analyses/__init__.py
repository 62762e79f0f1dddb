"""Tools for the committed results in docs/results. The analyses, each run as `python -m
experiments.analyses.<name> <results folder> ...`, read the folders' metrics
(`MetricWriter.read`, plain or compressed) and write `analysis.md` into the results folder
(`rlagent.analysis.report.write_analysis`); `mastermind_baseline` prints its JSON.
`compact_results` turns a run folder's metrics.csv into the metrics.csv.xz kept there."""
