"""``hydra/launcher=fiberrl``: a Hydra sweep's runs as job-backed processes of fiberrl's runtime,
several at once, retried from their own checkpoints when their job dies, resumable, with a live table."""
