"""The host side every launcher uses: the training loop (chunks, metrics, checkpoints,
exact and checked resume, refuse / overwrite of a run folder, held-out evaluation),
provenance and metric writers."""
