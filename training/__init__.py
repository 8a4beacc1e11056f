"""Training: config schema, optimizer, device set-up, checkpoints, metrics and the loop."""
