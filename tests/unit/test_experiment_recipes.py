"""Every experiment recipe composes through Hydra, and every point of its sweep grid validates."""

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.types import RunMode

from analysis.papers import PAPERS
from cli.config import register_configs, to_train_config
from tests.helpers import CONFIG_DIR, compose_config

RECIPES = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
SINGLE_RUNS = ("nanogpt_baby", "bpe_budget", "nanochat_cpu")  # training recipes, not sweeps (test_knobs.py)
EXPERIMENTS = [name for name in RECIPES if name not in SINGLE_RUNS]
PAPER_RECIPES = {"vaswani_a": "iso_param", "vaswani_b": "fixed_d_model", "bhojanapalli": "fixed_d_model"}
PAPER_RECIPES["gqa"] = "fixed_d_model"


def sweep_points(name: str, out_dir: str = "x") -> tuple[str, list[list[str]], list]:
    """The recipe's sweep dir, the overrides of every point of its grid (Hydra's basic sweeper takes the
    product) and each point's validated TrainConfig, composed in one Hydra context (fast)."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        base = [f"+experiment={name}", f"out_dir={out_dir}"]
        hydra_cfg = compose("config", base, return_hydra_config=True).hydra
        assert hydra_cfg.mode == RunMode.MULTIRUN, f"{name} is not a multirun recipe"
        params = hydra_cfg.sweeper.params.items()
        axes = [[f"{key}={v.strip()}" for v in str(values).split(",")] for key, values in params]
        grid = [list(point) for point in itertools.product(*axes)]
        # The seed changes no rule a config is checked against: one seed per shape keeps this fast.
        first_seed = next(a[0] for a in axes if a[0].startswith("seed=")) if "seed" in hydra_cfg.sweeper.params else ""
        configs = [to_train_config(compose("config", [*base, *p])) for p in grid if first_seed in p or not first_seed]
    return str(hydra_cfg.sweep.dir), grid, configs


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_point_of_every_recipe_validates(name, tmp_path):
    sweep_dir, grid, configs = sweep_points(name, str(tmp_path))
    assert all(c.budget_s is None for c in configs)  # sweeps train a step count, not the default time budget
    seeds = {o for point in grid for o in point if o.startswith("seed=")}
    assert len(seeds) >= 3, f"{name} sweeps {len(seeds)} seeds; recipes run at least 3"
    assert sweep_dir.startswith(f"multirun/{name}/")
    shapes = {(c.model.n_head, c.model.head_dim, c.model.kv_heads) for c in configs}
    assert len(shapes) * len(seeds) == len(grid)  # every point is a different run


@pytest.mark.parametrize("paper,mode", list(PAPER_RECIPES.items()))
def test_each_paper_has_a_cpu_and_a_gpu_recipe_with_its_report_command(paper, mode):
    assert paper in PAPERS
    for name in (f"{paper}_cpu", paper):
        cfg = compose_config([f"+experiment={name}", "out_dir=x"])
        assert cfg.fairness.mode == mode
        header = (Path(CONFIG_DIR) / "experiment" / f"{name}.yaml").read_text()
        assert f"#   python train.py +experiment={name}\n" in header  # no OMP_NUM_THREADS=1: the launcher sets it
        assert f"scripts/ablation_report.py multirun/{name}/<date_time> --paper {paper}" in header
    cpu = compose_config([f"+experiment={paper}_cpu", "out_dir=x"])
    assert cpu.model.d_model <= 128 and cpu.model.n_layer == 2 and cpu.max_steps <= 1000
    if mode == "iso_param":
        _, _, configs = sweep_points(f"{paper}_cpu")
        assert all(c.model.n_head * c.model.head_dim == c.model.d_model for c in configs)


def test_the_iso_flop_budget_buys_the_default_model_the_steps_of_the_other_sweeps():
    # Defect: 1.1e14 was "~600 steps of the default model" when that was d_model 256 at 32 x 256 tokens a
    # step; of today's default (d_model 128, 24 x 64 tokens) it bought ~8,700, 14x the other sweeps' 600.
    import dataclasses

    from model import GPT
    from studies.fairness import steps_for_flops

    recipe = ["+experiment=ablate_heads_iso_flop", "out_dir=x", "model.n_head=4", "model.d_k=null"]
    cfg, default = to_train_config(compose_config(recipe)), to_train_config(compose_config(["out_dir=x"]))
    assert cfg.model == dataclasses.replace(default.model, qk_norm=cfg.model.qk_norm)  # the default model
    model = GPT(dataclasses.replace(cfg.model, vocab_size=cfg.data.bpe_vocab_size))
    length = cfg.model.train_length  # the default trains on 128 tokens of its 1,024
    steps = steps_for_flops(cfg.fairness.flop_budget, model.flops_per_token(), cfg.batch_size * length)
    fixed = compose_config(["+experiment=ablate_heads_dk", "out_dir=x"]).max_steps
    assert 0.9 * fixed <= steps <= 1.1 * fixed, steps


def hydra_node(name: str):
    """The recipe's `hydra` node as train.py composes it (launcher, callbacks, sweep)."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("config", [f"+experiment={name}", "out_dir=x"], return_hydra_config=True).hydra


PARALLEL = "hydra_plugins.attnlab_launcher.ParallelLauncher"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_the_cpu_studies_run_two_jobs_at_a_time_on_one_thread_each(name):
    # iso_time must own the cores its budget was timed on, and a GPU-sized recipe's jobs would share one device.
    cpu_study = name.endswith(("_cpu", "_default")) or name in ("noise_floor", "first_finding")
    launcher = hydra_node(name).launcher
    assert (launcher._target_ == PARALLEL) == cpu_study, launcher
    if cpu_study:
        assert launcher.jobs is None and launcher.threads is None  # two jobs, each its share of the cores


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_recipes_header_gives_the_report_command_its_sweep_prints(name):
    from cli.sweep_hint import sweep_hint

    hint = hydra_node(name).callbacks.sweep_hint
    printed = sweep_hint("SWEEP", hint.get("paper"), hint.get("reference"), full_val=hint.get("full_val", True))
    report = printed.splitlines()[-1].removeprefix("  report: python ").replace("SWEEP", f"multirun/{name}/<date_time>")
    assert report.endswith(" --full-val")  # the sweep suggests the report scored on every held-out token
    report = report.removesuffix(" --full-val")  # a header may give it scored on the loop's batches
    header = (Path(CONFIG_DIR) / "experiment" / f"{name}.yaml").read_text()
    lines = [line.removeprefix("#   python ") for line in header.splitlines() if "scripts/ablation_report.py" in line]
    assert lines or not hint.get("paper"), f"{name} names a paper section but its header gives no report command"
    assert all(line.startswith(report) for line in lines), (report, lines)


DEFAULT_SCALE = {  # recipe: (its paper section, its reference cell, the (n_head, d_k) grid issue #31 asks for)
    "vaswani_a_default": ("vaswani_a", "model.n_head=4", {(h, 128 // h) for h in (1, 2, 4, 8, 16)}),
    "vaswani_b_default": ("vaswani_b", "model.d_k=32", {(4, d_k) for d_k in (8, 16, 32, 64)}),
    "bottleneck_default": ("bhojanapalli", "model.n_head=8,model.d_k=null", {(8, 16), (8, 32), (16, 8), (16, 32)}),
}


@pytest.mark.parametrize("name", DEFAULT_SCALE)
def test_a_default_scale_study_trains_the_noise_floors_recipe_for_1000_steps_over_its_grid(name):
    import dataclasses

    from analysis.papers import check_swept_keys

    paper, reference, grid = DEFAULT_SCALE[name]
    _, points, configs = sweep_points(name)
    default = sweep_points("noise_floor")[2][0]  # the recipe the noise floor pins (+recipe=muon_rope_bpe)
    for cfg in configs:  # the noise floor's model, data, optimizer and batch; only the swept shape differs
        assert cfg.model == dataclasses.replace(default.model, n_head=cfg.model.n_head, d_k=cfg.model.d_k)
        assert (cfg.data, cfg.optim, cfg.batch_size) == (default.data, default.optim, default.batch_size)
        assert (cfg.max_steps, cfg.budget_s, cfg.fairness.mode) == (1000, None, "fixed_d_model")
    assert {(c.model.n_head, c.model.head_dim) for c in configs} == grid
    if name != "bottleneck_default":  # the noise floor's runs are this study's reference cell, seed for seed
        (cell,) = [c for c in configs if (c.model.n_head, c.model.head_dim) == (4, 32)]
        assert dataclasses.replace(cell, model=dataclasses.replace(cell.model, d_k=None)) == default
    assert len({o for point in points for o in point if o.startswith("seed=")}) >= 5
    hydra = hydra_node(name)
    assert (hydra.callbacks.sweep_hint.paper, hydra.callbacks.sweep_hint.reference) == (paper, reference)
    swept = sorted(key for key in hydra.sweeper.params if key != "seed")
    check_swept_keys(paper, PAPERS[paper][1], swept)  # the report's paper section takes this sweep
    header = (Path(CONFIG_DIR) / "experiment" / f"{name}.yaml").read_text()
    assert f"#   python train.py +experiment={name}\n" in header and "min on a 2-core" in header


def test_the_first_finding_is_vaswani_a_cpus_one_two_and_four_heads_in_12_runs_scored_on_every_held_out_token():
    from analysis.papers import check_swept_keys

    _, grid, configs = sweep_points("first_finding")
    assert len(grid) == 12 and len({o for point in grid for o in point if o.startswith("seed=")}) == 4
    assert [(c.model.n_head, c.model.head_dim) for c in configs] == [(1, 64), (2, 32), (4, 16)]
    # The same three cells as the Table 3 (A) study on the plain GPT, at its size, steps and fairness mode.
    table = {c.model.n_head: c for c in sweep_points("vaswani_a_cpu")[2]}
    assert all(c == table[c.model.n_head] for c in configs)
    hint = hydra_node("first_finding").callbacks.sweep_hint
    assert (hint.paper, hint.reference, hint.full_val) == ("vaswani_a", "model.n_head=1", True)
    check_swept_keys("vaswani_a", PAPERS["vaswani_a"][1], ["model.n_head"])
