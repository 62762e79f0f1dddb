"""Post-hoc analyses of committed results, each a module run with `python -m
experiments.analyses.<name> <results folder> ...`: it reads the folders' metrics
(`MetricWriter.read`, plain or gzipped) and writes `analysis.md` into the results folder
(`rlagent.analysis.report.write_analysis`). `mastermind_baseline` prints its JSON."""
