"""Training pipelines around the RL trainer: behaviour cloning of demonstrations before RL
(`warm_start`)."""
