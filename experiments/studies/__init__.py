"""The studies of this repository, each a module with `run(config, workdir, ...)`:
`sparse_vs_dense` (the main study), `credit_accuracy`, `label_quality` (part of
`process_rewards`), `process_rewards` and `horizon_sweep`. What they share is `common`.
The launchers experiments/<study>.py parse flags and call one of them."""
