"""Statistics over seeds (`stats`) and per-condition summaries and plots (`report`)."""
