"""What the command-line entry points show: --help generated from the schema, one-line errors, and
what `python train.py` prints around a run."""
