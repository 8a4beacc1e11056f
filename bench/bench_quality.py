"""The best model per CPU-minute: recipes trained for the same whole-process wall-clock, side by side
in one run, each scored on *every* token of the val split.

    python bench/bench_quality.py                          # the default vs nanoGPT's CPU baby GPT, 300 s each
    python bench/bench_quality.py --budget 120 --seeds 1 2 3 --recipes default adamw ...
    python bench/bench_quality.py --budget 300 -- data=shakespeare_gpt2   # Hydra overrides for every recipe
    python bench/bench_quality.py --classical                # the compressors' bits/byte on the default val split

Each recipe is `python train.py` with its overrides, `budget_s` set so the whole process (start-up,
data, training, the last evaluation and save) fits the budget; the process's wall-clock is measured
from outside; a recipe that compiles (the default does) compiles from an empty cache, as a first run
does, inside budget_s. The score is the best checkpoint's mean loss over non-overlapping windows covering the
whole val split (training/evaluate.py split_loss), in nats per token and bits per UTF-8 byte, so
char and BPE models compare, and beside it the classical floor: the best of PPMd, xz, bzip2, zstd and zpaq -m5
primed with the train text and charged for the same val bytes (bench/classical.py; `--classical` prints
them all, no model). Recipes run one after another on the whole machine unless --jobs says otherwise
(then each run gets its share of the cores, alike for every recipe).

On a shared machine a wall-clock budget measures the neighbours as much as the recipe. `--equal-time-steps`
keeps the budget but takes it out of the training runs: it first times every recipe's own step
(Trainer.step, on the whole machine, each in a process of its own) in turns, so any load falls on all of
them alike, then trains each
for the steps its speed buys in (budget - start-up) seconds. Those runs are deterministic, so they may
run in parallel under any load (--jobs).

    python bench/bench_quality.py --equal-time-steps --budget 150 --seeds 1 2 3 --jobs 2 --reference default \
        --recipes default adamw cosine batch_6 relu2 tied learned_positions fp32   # the recipe ablation
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch

from analysis.full_val import score_checkpoint
from analysis.stats import fmt_interval, t_interval
from analysis.trained import find_checkpoint
from bench import classical
from bench.bench_train import in_fresh_process, load_config
from bench.leave_one_out import LEAVE_ONE_OUT
from cli.errors import LAUNCHER_PID, exit_with_error
from cli.schema_help import OneLineParser, at_least
from data.config import DataConfig
from data.prepare import prepare
from data.text_file import Refused, read_json, read_json_object
from rundir.files import SUMMARY
from studies.fairness import measure_seconds_per_step
from training.config import TrainConfig
from training.runtime import device_name, resolve_device
from training.trainer import Trainer

STARTUP_S = 20  # imports, cached data, model set-up: outside budget_s, inside the whole-process budget
# torch.compile's cache (inductor's environment variable): each run gets an empty one of its own, so a compiled
# recipe is measured as a first run pays for it (31-37 s for the default on a Zen 4, ~7 s from the cache:
# docs/evidence/recipe/round12.md).
COMPILE_CACHE = "TORCHINDUCTOR_CACHE_DIR"
# Each *_UNDONE list takes out what docs/evidence/recipe/roundN.md added to the default, on top of the later ones.
# round23.md: the continuous cache mixed into the same model's predictions (model/pointer.py).
ROUND_23_UNDONE = ["model.pointer_weight=0"]
# round20.md: the same training scored in windows of 4,096 tokens instead of 1,024 (configs/model/small.yaml).
ROUND_20_UNDONE = [*ROUND_23_UNDONE, "model.block_size=1024"]
# round18.md: the cooldown over the last 60% of training instead of 30% (configs/optim/muon.yaml).
ROUND_18_UNDONE = [*ROUND_20_UNDONE, "optim.cooldown_frac=0.3"]
# round15.md: a hashed bigram table at the model's input (model/bigram.py).
ROUND_15_UNDONE = [*ROUND_18_UNDONE, "model.bigram_embeds=0"]
# round14.md: the same training scored in windows of 1,024 tokens instead of 128 (layer 3 windowed to 128 keys).
ROUND_14_UNDONE = [
    *ROUND_15_UNDONE,
    "model.block_size=128",
    "model.train_block_size=null",
    "model.long_window_size=null",
]
# round11.md: an evaluation and a save every 250 steps; its uncompiled evaluation is code, which no override undoes.
ROUND_11_UNDONE = [*ROUND_14_UNDONE, "eval_interval=100"]
ROUND_10_UNDONE = [*ROUND_11_UNDONE, "model.x0_mix=false", "model.window_pattern=null"]  # round10.md's model
# Each recipe: the overrides that make it (the default is the configs as they are).
RECIPES = {
    **LEAVE_ONE_OUT,
    "default": [],
    "nanogpt_baby": ["+experiment=nanogpt_baby"],
    # The default before docs/evidence/recipe/round23.md: the same training, predictions without the continuous cache.
    "round22": [*ROUND_23_UNDONE],
    # The default before docs/evidence/recipe/round20.md: a context of 1,024, scored in windows of 1,024.
    "round19": [*ROUND_20_UNDONE],
    # The default before docs/evidence/recipe/round18.md: a cooldown over the last 30% of training.
    "round17": [*ROUND_18_UNDONE],
    # The default before docs/evidence/recipe/round15.md: no bigram table.
    "round14": [*ROUND_15_UNDONE],
    # The default before docs/evidence/recipe/round14.md: a context of 128, scored in windows of 128.
    "round13": [*ROUND_14_UNDONE],
    # A candidate not resolved at equal time (docs/evidence/recipe/round8.md): the default 6 layers deep.
    "layers_6": ["model.n_layer=6"],
    # The default before docs/evidence/recipe/round11.md: an evaluation and a save every 100 steps.
    "round10": [*ROUND_11_UNDONE],
    # The default before docs/evidence/recipe/round10.md: no residual mix, no sliding windows.
    "round9": [*ROUND_10_UNDONE],
    # The default before docs/evidence/recipe/round9.md: eager, not compiled.
    "round8": [*ROUND_10_UNDONE, "compile=false"],
    # The default before docs/evidence/recipe/round8.md: the one deterministic segmentation of the train text.
    "round7": [*ROUND_10_UNDONE, "compile=false", "data.bpe_dropout=0"],
    # The default before docs/evidence/recipe/round5.md: the last step's weights, no average.
    "round4": [*ROUND_10_UNDONE, "compile=false", "data.bpe_dropout=0", "optim.average_from=null"],
    # The default before docs/evidence/recipe/round4.md: no decay on Muon's matrices or the token table either.
    "round3": [
        *ROUND_10_UNDONE,
        "compile=false",
        "data.bpe_dropout=0",
        "optim.muon_weight_decay=0.0",
        "optim.embedding_weight_decay=0.0",
        "optim.average_from=null",
    ],
    # The default before docs/evidence/recipe/round3.md: 24 x 64 tokens, no gate, a tied head at the AdamW lr.
    "round2": ["+recipe=muon_rope_bpe"],  # configs/recipe/muon_rope_bpe.yaml, which the noise floor and the studies pin
    # The recipe ablation: one choice of the default undone, or one knob the search rejected turned on.
    "adamw": [
        "optim=adamw",
        "optim.lr=3e-3",
        "optim.min_lr=3e-4",
        "optim.schedule=wsd",
        "optim.cooldown=1-sqrt",
        "optim.cooldown_frac=0.6",
    ],
    "cosine": ["optim.schedule=cosine"],
    "batch_6": ["batch_size=6"],
    "relu2": ["model.activation=relu2"],
    "rope_qk_norm": ["model.pos_encoding=rope", "model.qk_norm=true"],  # now the default; the docs' commands name it
    "learned_positions": ["model=plain"],  # the plain GPT: GPT-2's layout, which exports
    "tied": ["model.tie_embeddings=true", "optim.embedding_lr=null"],
    "fp32": ["precision=fp32"],  # what bf16 autocast buys where the CPU has it natively (AMX, AVX512-BF16)
    # The batch layout at the new step cost: more sequences a step, or longer ones at the same tokens a step.
    "batch_32": ["batch_size=32"],
    "context_64": ["model.block_size=64", "batch_size=24"],
    # The tokenizer: one token a character (the recipes above were chosen on it), or another BPE size.
    "char": ["data=shakespeare"],
    "bpe_1024": ["data.bpe_vocab_size=1024"],
    "bpe_2048": ["data.bpe_vocab_size=2048"],
    # GPT-2's BPE (50257 tokens): compare with the char recipes in bits/byte.
    "bpe_budget": ["+experiment=bpe_budget"],
    # nanochat's CPU recipe in our code (configs/experiment/nanochat_cpu.yaml): the stronger baseline.
    "nanochat_cpu": ["+experiment=nanochat_cpu"],
    # The attention variants (docs/variants.md) on the default recipe, each alone.
    "gate_headwise": ["model.attn_gate=headwise"],
    "no_gate": ["model.attn_gate=null"],
    "attn_softcap": ["model.attn_softcap=10"],
    "sinks": ["model.attn_sinks=true"],
    "window_SSSL": ["model.window_pattern=SSSL", "model.window_size=32"],  # a quarter of the 128-token context
    "value_embeds": ["model.value_embeds=true"],
    "diff_attn": ["model.attn_diff=true"],
    "mla_64": ["model.mla_latent=64"],  # the cache keeps a latent of 64 and a rope key of 16 for K and V of 2 x 128
}


def run_recipe(name: str, overrides: list[str], length: list[str], seed: int, out: Path, threads: int) -> dict:
    """Train one recipe for `length` (budget_s or max_steps), then score it on the full val split (each in
    its own process, with `threads` intra-op threads)."""
    args = [sys.executable, str(ROOT / "train.py"), *overrides, f"seed={seed}", f"out_dir={out}", *length]
    args += ["logger=none", "sample_tokens=0", "progress=false"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), COMPILE_CACHE: str(out.with_name(out.name + ".compiled"))}
    env[LAUNCHER_PID] = str(os.getpid())  # a SIGTERM to this process alone left its runs training on, orphaned
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-2000:]}")
    score = subprocess.run([sys.executable, __file__, "--score", str(out)], capture_output=True, text=True, env=env)
    if score.returncode != 0:
        raise RuntimeError(f"scoring {name} failed:\n{score.stderr[-2000:]}")
    summary = read_json_object(out / SUMMARY)
    row = {"recipe": name, "seed": seed, "steps": summary["step"], "tokens_per_s": summary["tokens_per_s"]}
    return row | {"wall_s": wall} | json.loads(score.stdout.strip().splitlines()[-1])


def runs_dir(keep: Path | None, recipes: list[str], seeds: list[int]) -> contextlib.AbstractContextManager[str]:
    """Where the runs go: `keep` (--keep), which must not hold a run of the same name, or a temporary directory."""
    if keep is None:
        return tempfile.TemporaryDirectory()
    taken = [f"{n}_{s}" for s in seeds for n in recipes if (keep / f"{n}_{s}").exists()]
    if taken:
        sys.exit(f"--keep {keep} already holds {', '.join(taken)}; name an empty directory")
    keep.mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(str(keep))


def score(run: Path) -> dict:
    """The loss of a checkpoint (a run directory: its best) on every token of its data's val split."""
    path = find_checkpoint(run)
    result = score_checkpoint(path)
    # The model's figure first: the compressors' floor may take minutes on a corpus not measured before
    print(f"{run} ({path.name}, step {result['step']}): {result['val/bpb']:.4f} bits/byte", file=sys.stderr, flush=True)
    data_cfg = DataConfig(**result["data"])
    if not classical.cache_path(data_cfg).is_file():
        print("classical floor: measuring the compressors on this corpus (once; cached)", file=sys.stderr, flush=True)
    best = classical.floor(baselines(data_cfg))
    floor = {"floor": best["compressor"], "floor_bpb": best["bits_per_byte"]} if best else {"floor_bpb": None}
    which = {"checkpoint": str(path), "step": result["step"]}  # a live run's best moves on between two scores
    return which | {"params": result["params"], "val_loss": result["val/loss"], "val_bpb": result["val/bpb"]} | floor


def score_line(run: Path, scored: dict) -> str:
    """--score's result in words: the model's figure (and which checkpoint) and the classical floor beside it."""
    which = f" ({Path(scored['checkpoint']).name}, step {scored['step']})"
    line = (
        f"{run}{which}: {scored['val_bpb']:.4f} bits/byte on every held-out token ({scored['val_loss']:.4f} nats/token)"
    )
    if scored["floor_bpb"] is None:
        return f"{line}; no classical floor (--classical says why)"
    gap = scored["val_bpb"] - scored["floor_bpb"]
    return f"{line}; {scored['floor']} primed with the train text {scored['floor_bpb']:.4f} ({gap:+.4f})"


def baselines(data_cfg: DataConfig) -> dict:
    """The classical compressors on `data_cfg`'s val split: measured on this CPU once, then cached."""
    data = prepare(data_cfg, progress=False)
    return classical.baselines(data_cfg, data.meta, device_name(torch.device("cpu")))


def seconds_per_step(
    recipes: list[str], overrides: list[str], steps: int = 15, rounds: int = 3
) -> dict[str, tuple[float, float]]:
    """Median seconds of each recipe's Trainer.step (what train.py runs) and of its compilation (0 if it does not
    compile), each timed in a fresh process of its own, as train.py runs it, the recipes in turns for `rounds`
    rounds. One process holding every recipe's Trainer timed the default's step at 115-120 ms against 98 alone,
    on a Zen 4: the recipes' memory interfered (docs/evidence/recipe/round4.md)."""
    times: dict[str, list[list[float]]] = {name: [] for name in recipes}
    for _ in range(rounds):
        for name in recipes:
            job = {"overrides": [*RECIPES[name], *overrides], "steps": steps}
            times[name].append(in_fresh_process(__file__, "--time-step", job))
    median = statistics.median
    return {name: (median(t[0] for t in ts), median(t[1] for t in ts)) for name, ts in times.items()}


def time_step(job: dict) -> list[float]:
    """One timing process: the recipe's Trainer, compiled from an empty cache if it compiles (Trainer.prepare, as
    train.py does), then [the median of its steps (fairness.measure_seconds_per_step, the iso_time calibration's
    own timer, after its warm-up step), the compilation's seconds]."""
    cfg = load_config(job["overrides"])
    trainer = Trainer(cfg, prepare(cfg.data, progress=False), resolve_device(cfg.device))
    with tempfile.TemporaryDirectory() as cache:
        os.environ[COMPILE_CACHE] = cache
        trainer.prepare()
        return [measure_seconds_per_step(trainer, job["steps"]), trainer.compile_s]


def print_baselines(result: dict) -> None:
    """The classical compressors' rows (bench/classical.py), with the CPU and date they were measured on."""
    if "skipped" in result:
        print(f"classical baselines skipped: {result['skipped']}", flush=True)
        return
    best = classical.floor(result)
    print(
        f"\nclassical compressors primed with the {result['train_bytes']:,} train bytes, charged for the "
        f"{result['val_bytes']:,} val bytes of {result['val_documents']} documents "
        f"({result['date']}, {result['cpu']}):"
    )
    for r in result["rows"]:
        floor = "  <- the floor" if r is best else ""
        print(f"  {r['compressor']:<18}{r['bits_per_byte']:>8.4f} bits/byte{r['seconds']:>7.0f} s{floor}", flush=True)
    for name, why in result.get("not_measured", {}).items():
        print(f"  {name:<18}skipped: {why}", flush=True)


def print_table(rows: list[dict], reference: str) -> None:
    head = f"{'recipe':<18}{'params':>9}{'steps':>8}{'tokens/s':>10}{'wall s':>8}"
    print(f"\n{head}  {'val nats/token':<26}{'val bits/byte':<26}{'above floor':>11}")
    by_recipe: dict[str, list[dict]] = {}
    for r in rows:
        by_recipe.setdefault(r["recipe"], []).append(r)
    for name, runs in by_recipe.items():
        loss = t_interval([r["val_loss"] for r in runs])
        bpb = t_interval([r["val_bpb"] for r in runs])
        floor = runs[0]["floor_bpb"]
        above = "—" if floor is None else f"{bpb.mean - floor:+.4f}"
        print(
            f"{name:<18}{runs[0]['params'] / 1e6:>8.2f}M{statistics.median(r['steps'] for r in runs):>8.0f}"
            f"{statistics.median(r['tokens_per_s'] for r in runs):>10,.0f}{max(r['wall_s'] for r in runs):>8.0f}  "
            f"{fmt_interval(loss):<26}{fmt_interval(bpb):<26}{above:>11}"
        )
    for floor in sorted({(r["floor"], r["floor_bpb"]) for r in rows if r["floor_bpb"] is not None}):
        print(f"classical floor: {floor[0]}, {floor[1]:.4f} bits/byte on the same val bytes")
    ref = {r["seed"]: r["val_bpb"] for r in by_recipe.get(reference, [])}
    for name, runs in by_recipe.items():
        if name != reference and ref:
            diff = t_interval([r["val_bpb"] - ref[r["seed"]] for r in runs if r["seed"] in ref])
            print(f"{name} - {reference}: {fmt_interval(diff, signed=True)} bits/byte (paired by seed)")


def read_steps(path: Path, args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, int]:
    """The step counts a --time-only run wrote, for the recipes: each must have been timed with the same recipe,
    the same overrides after -- and the same --budget (a 60 s file trained a "300 s" table's runs)."""
    recipes = args.recipes
    try:
        timing = read_json(path, "--steps-from")
        timed = timing["recipes"]
    except Refused as e:
        parser.error(f"{e.where}: not a --time-only file ({e.reason})")
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"--steps-from {path}: not a --time-only file ({type(e).__name__}: {e})")
    if (budget := timing.get("budget")) != args.budget:
        shown = f"{budget:g}" if isinstance(budget, (int, float)) else repr(budget)
        parser.error(f"--steps-from {path} was timed for --budget {shown}, not {args.budget:g}")
    if timing.get("overrides", []) != args.overrides:
        parser.error(
            f"--steps-from {path} was timed with the overrides {timing.get('overrides', [])}, not {args.overrides}"
        )
    for name in recipes:
        if name not in timed or timed[name].get("overrides") != RECIPES[name]:
            parser.error(f"--steps-from {path}: recipe {name!r} was not timed there with the overrides {RECIPES[name]}")
    return {name: int(timed[name]["steps"]) for name in recipes}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--budget",
        type=float,
        default=300.0,
        help=f"whole-process seconds per run: budget_s is this less {STARTUP_S} s for start-up (imports, data, set-up)",
    )
    parser.add_argument(
        "--recipes",
        nargs="+",
        default=["default", "nanogpt_baby"],
        metavar="RECIPE",
        help="default: default nanogpt_baby (the README's headline table is --recipes default nanochat_cpu "
        f"--reference nanochat_cpu); any of {', '.join(sorted(RECIPES))} or a --define'd name; leave_one_out "
        "is the default and each no_* recipe (bench/leave_one_out.py)",
    )
    parser.add_argument("--seeds", type=at_least(0), nargs="+", default=[1337])
    parser.add_argument(
        "--reference", default="nanogpt_baby", metavar="RECIPE", help="recipe the others are compared against"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep each run in DIR/RECIPE_SEED (default: a temporary directory)"
    )
    parser.add_argument(
        "--jobs", type=at_least(1), default=1, help="runs at once, sharing the cores (2 cores: 1 thread each)"
    )
    parser.add_argument(
        "--equal-time-steps",
        action="store_true",
        help="train each recipe for the steps its measured speed buys in the budget, not for the budget itself",
    )
    parser.add_argument(
        "--score",
        type=Path,
        metavar="RUN",
        help="only score RUN's best checkpoint (or a checkpoint file) on every token of the val split: JSON on stdout, "
        "a line in words on stderr",
    )
    parser.add_argument(
        "--classical",
        action="store_true",
        help="only print the classical compressors' bits/byte on the val split the overrides name",
    )
    parser.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="'NAME: OVERRIDES'",
        help="a recipe of your own, e.g. --define 'ctx_128: model.block_size=128 batch_size=12', named in --recipes",
    )
    parser.add_argument(
        "--time-only",
        type=Path,
        metavar="JSON",
        help="only time each recipe's step (as --equal-time-steps does) and write the steps the budget buys to JSON",
    )
    parser.add_argument(
        "--steps-from",
        type=Path,
        metavar="JSON",
        help="train each recipe for the steps a --time-only run wrote (timed quietly; the runs may share the CPU)",
    )
    parser.add_argument("--time-step", help=argparse.SUPPRESS)  # a timing process's job (seconds_per_step)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every recipe, after --")
    return parser


# What --score and --classical ignore: the options of a comparison's runs (and, for --score, the overrides and
# --classical too: it scores the run as that run was configured).
RUN_OPTIONS = ("budget", "recipes", "seeds", "reference", "json", "keep", "jobs", "define")
RUN_OPTIONS += ("equal_time_steps", "time_only", "steps_from")  # each chooses the runs' steps


def refuse_what_a_mode_ignores(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A one-line error naming an option the chosen mode would drop: `--score RUN --seeds 1 2` scored RUN once."""
    if not (args.score or args.classical):
        return
    mode = "--score" if args.score else "--classical"
    ignorable = (*RUN_OPTIONS, "classical") if args.score else RUN_OPTIONS
    ignored = [name for name in ignorable if getattr(args, name) != parser.get_default(name)]
    if args.score and args.overrides:
        parser.error(f"--score scores RUN as it was configured; overrides ({' '.join(args.overrides)}) do not apply")
    if ignored:
        option = "--" + ignored[0].replace("_", "-")
        parser.error(f"{option} has no effect with {mode}, which trains nothing; drop one of them")


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    refuse_what_a_mode_ignores(parser, args)
    if args.time_step:
        print(json.dumps(time_step(json.loads(args.time_step))))
    elif args.score:
        try:
            scored = score(args.score)
        except (ValueError, OSError) as e:  # no checkpoint, a damaged one, data that cannot be prepared
            exit_with_error(e)
        print(json.dumps(scored))  # stdout, one line: what a comparison's runs are read by
        print(score_line(args.score, scored), file=sys.stderr)  # the same, for a person
    elif args.classical:  # the compressors alone: no model, no budget
        try:
            data_cfg = load_config(args.overrides).data
        except ValueError as e:
            parser.error(str(e))
        try:
            print_baselines(baselines(data_cfg))
        except (ValueError, OSError) as e:  # data that cannot be prepared
            exit_with_error(e)
    else:
        configs = checked_configs(parser, args)
        steps_from = read_steps(args.steps_from, args, parser) if args.steps_from else None
        compare(args, configs, steps_from)


def checked_configs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, TrainConfig]:
    """Each recipe's config, after every check a comparison needs: a bad value is refused in one line now, not
    after the first runs' minutes. --define'd recipes join RECIPES."""
    if not STARTUP_S < args.budget < math.inf:  # NaN fails both
        parser.error(f"--budget {args.budget} must be finite and exceed the {STARTUP_S} s reserved for start-up")
    for definition in args.define:
        name, sep, overrides = definition.partition(":")
        if not sep or not name.strip() or not overrides.split():
            parser.error(f"--define {definition!r} must read 'NAME: OVERRIDE OVERRIDE ...'")
        RECIPES[name.strip()] = overrides.split()
    if "leave_one_out" in args.recipes:  # the default, then the default less each of its mechanisms
        at = args.recipes.index("leave_one_out")
        args.recipes[at : at + 1] = [r for r in ["default", *LEAVE_ONE_OUT] if r not in args.recipes]
    for name in [*args.recipes, args.reference]:
        if name not in RECIPES:
            parser.error(f"recipe {name!r} is unknown; choose one of: {', '.join(sorted(RECIPES))} (or --define it)")
    configs = {}
    for name in args.recipes:
        try:
            # as each run gets it: its length set by the comparison (a recipe's max_steps=null was refused alone)
            configs[name] = load_config([*RECIPES[name], *args.overrides, *budget_length(args.budget)])
        except ValueError as e:
            parser.error(f"recipe {name}: {e}")
    chosen = [f for f, v in (("--time-only", args.time_only), ("--steps-from", args.steps_from)) if v]
    chosen += ["--equal-time-steps"] if args.equal_time_steps else []
    if len(chosen) > 1:  # each decides the steps its own way
        parser.error(f"{' and '.join(chosen)} each choose the steps; give one of them")
    # each of these failed only after minutes of training (a traceback, and --json's rows lost)
    if repeated := sorted({s for s in args.seeds if args.seeds.count(s) > 1}):
        parser.error(f"--seeds gives {', '.join(map(str, repeated))} twice; give each seed once")
    if args.json is not None and (args.json.is_dir() or not args.json.parent.is_dir()):
        parser.error(f"--json {str(args.json)!r} is not a file in an existing folder; give FILE.json")
    if args.keep is not None and args.keep.exists() and not args.keep.is_dir():
        parser.error(f"--keep {str(args.keep)!r} is a file; give a folder for the runs")
    return configs


def compare(args: argparse.Namespace, configs: dict[str, TrainConfig], steps_from: dict[str, int] | None) -> None:
    """The comparison: the classical floor of each split, then every recipe and seed trained and scored, and the
    table (or, with --time-only, the steps each recipe's measured speed buys, written to JSON)."""
    cpu = device_name(torch.device("cpu"))
    print(
        f"attnlab bench_quality: {time.strftime('%Y-%m-%d %H:%M')}, {cpu}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; {args.budget:g} s whole-process per run"
        f"{' (as the steps each recipe measured speed buys)' if args.equal_time_steps else ''}; "
        f"overrides {args.overrides or 'none'}",
        flush=True,
    )
    splits = {classical.cache_path(cfg.data): cfg.data for cfg in configs.values()}  # recipes share a split
    for data_cfg in splits.values():  # measured (or read from the cache) now, so the scorers only read it
        print_baselines(baselines(data_cfg))
    length = run_lengths(args, cpu, steps_from)
    if args.time_only:
        return
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    print(f"{args.jobs} run(s) at a time, {threads} thread(s) each", flush=True)
    rows = []
    with runs_dir(args.keep, args.recipes, args.seeds) as tmp, ThreadPoolExecutor(args.jobs) as pool:
        jobs = [(name, seed) for seed in args.seeds for name in args.recipes]
        futures = [
            pool.submit(run_recipe, n, RECIPES[n] + args.overrides, length[n], s, Path(tmp) / f"{n}_{s}", threads)
            for n, s in jobs
        ]
        try:
            for (name, seed), future in zip(jobs, futures, strict=True):
                row = future.result()
                rows.append(row)
                print(
                    f"  {name} seed {seed}: {row['val_bpb']:.4f} bits/byte ({row['val_loss']:.4f} nats/token), "
                    f"{row['steps']} steps, {row['wall_s']:.0f} s",
                    flush=True,
                )
        except KeyboardInterrupt:  # the queued runs went on training at full budget, then a traceback
            pool.shutdown(wait=True, cancel_futures=True)  # the runs under way had the Ctrl-C too (one group)
            print("interrupted: the runs under way stopped, the queued ones never started", file=sys.stderr)
            sys.exit(130)
    print_table(rows, args.reference)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    assert all(math.isfinite(r["val_bpb"]) for r in rows)


def budget_length(budget: float) -> list[str]:
    """A run's length as overrides, for `budget` whole-process seconds: budget_s without the start-up's."""
    return [f"budget_s={budget - STARTUP_S}", "max_steps=null"]


def run_lengths(args: argparse.Namespace, cpu: str, steps_from: dict[str, int] | None) -> dict[str, list[str]]:
    """Each recipe's length as overrides: the budget itself, the steps its measured speed buys in it
    (--equal-time-steps, --time-only, which also writes them to JSON), or the steps --steps-from read."""
    length = {name: budget_length(args.budget) for name in args.recipes}
    if args.equal_time_steps or args.time_only:
        speeds = seconds_per_step(args.recipes, args.overrides)
        timing = {"cpu": cpu, "date": time.strftime("%Y-%m-%d %H:%M"), "budget": args.budget, "recipes": {}}
        timing["overrides"] = args.overrides  # --steps-from trains them only with the same
        timed_on = torch.get_num_threads()
        for name, (seconds, compile_s) in speeds.items():
            steps = int((args.budget - STARTUP_S - compile_s) / seconds)  # the budget pays for the compilation
            if steps < 1:  # a negative count went into the JSON, and --steps-from trained nothing sensible
                sys.exit(
                    f"error: --budget {args.budget:g} leaves {name} no step: {STARTUP_S} s start-up and "
                    f"{compile_s:.0f} s compiling, then {seconds:.2f} s a step; give a larger --budget"
                )
            timing["recipes"][name] = {"ms_per_step": seconds * 1000, "compile_s": compile_s, "steps": steps}
            timing["recipes"][name]["overrides"] = RECIPES[name]
            length[name] = [f"max_steps={steps}", "budget_s=null"]
            compiled = f" after {compile_s:.0f} s compiling" if compile_s else ""
            print(f"  {name}: {seconds * 1000:.1f} ms/step on {timed_on} threads{compiled} -> {steps} steps")
        if args.time_only:
            args.time_only.write_text(json.dumps(timing, indent=2) + "\n")
            print(f"steps per recipe written to {args.time_only}; train them with --steps-from {args.time_only}")
    if steps_from:
        for name, steps in steps_from.items():
            length[name] = [f"max_steps={steps}", "budget_s=null"]
            print(f"  {name}: {steps} steps (timed in {args.steps_from})")
    return length


if __name__ == "__main__":
    main()
