"""The names of a run directory's record files, for the trainer that writes them and the tools that
read them (the ablation report, run plots, the lab), which need not import torch to know them."""

METRICS = "metrics.jsonl"  # one JSON record per log step and per evaluation
RUN_INFO = "run_info.json"  # shape, size and resolved config, written when training starts
SUMMARY = "summary.json"  # final metrics and speed, written when it ends
