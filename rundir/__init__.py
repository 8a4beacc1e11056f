"""A run's directory: its lock, checkpoints, resume rules and records, behind `rundir.run.Run`."""
