"""Training: config schema, optimizer and schedule, runtime (device, precision, compile), distribution,
the weight average, set-up and the loop (checkpoints and records are rundir's)."""
