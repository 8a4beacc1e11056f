"""Studies over many runs that sit on top of training: what an ablation holds fixed (fairness)."""
