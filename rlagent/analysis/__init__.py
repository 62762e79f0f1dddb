"""Statistics over seeds (`stats`: intervals, tests, their formatters) and summaries of
metric rows (`report`: per-condition training summaries, plots, and the row helpers every
study's summary is built from: `seed_curves`, `final_mean`, `group_rows`, `cell_mean_cis`,
`markdown_rows`)."""
