"""Thin launchers and benchmarks; the logic lives in rlagent."""
