"""Preference learning for multi-turn agents (docs/preference.md).

`data` (the JSONL format, writer and validating loader), `pairs` (pairs as arrays:
from records, from ranked groups, from forks), `dpo` (the loss on episodes and the
offline trainer), `judges` (what ranks episodes) and `online` (online DPO / RLAIF).
"""
