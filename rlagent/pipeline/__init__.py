"""Training pipelines around the RL trainer: SFT before RL on demonstrations or on the
current policy's best-of-N samples (`warm_start`, `rejection`) and a curriculum driven by
success (`curriculum`)."""
