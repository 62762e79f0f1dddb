"""The host side every launcher uses: run folders (`workdir`: refuse / overwrite / checked
resume, for the loop and every study), the training loop (`loop`: chunks, metrics,
checkpoints, exact resume, held-out evaluation), provenance and metric writers."""
