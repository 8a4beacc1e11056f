"""Plot one or more runs' metrics into one PNG: train/val loss, lr and tokens/s against step and wall time.

    python scripts/plot_run.py outputs/latest                       # -> outputs/latest/plots.png
    python scripts/plot_run.py runs/h4_dk8 runs/h1_dk32 --out compare.png   # overlaid, one colour per run

Reads RUN/metrics.jsonl only (see rundir/records.py); no wandb needed. An existing image is
replaced only with --force, except one run's own RUN/plots.png (the default), which the trainer
redraws too. A bad input prints one line `error: ...` and writes nothing.
"""

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python scripts/plot_run.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.outputs import check_replaceable
from cli.errors import exit_with_error
from cli.schema_help import OneLineParser
from rundir.records import image_path, plot_runs


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="directories holding metrics.jsonl")
    parser.add_argument(
        "--out", type=Path, help="image to write (default: RUN_DIR/plots.png for one run, else plots.png)"
    )
    parser.add_argument("--force", action="store_true", help="replace the image if it exists")
    args = parser.parse_args(argv)
    # One run's own RUN/plots.png is the figure the trainer draws there too: redrawing it loses nothing.
    own_plot = args.out is None and len(args.run_dirs) == 1
    out = args.out or (args.run_dirs[0] / "plots.png" if own_plot else Path("plots.png"))
    try:
        if not own_plot:
            check_replaceable(image_path(out), args.force)
        path = plot_runs(args.run_dirs, out)
    except (ValueError, OSError) as e:  # FileNotFoundError is an OSError
        exit_with_error(e)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
