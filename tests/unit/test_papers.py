"""The papers' claims checked against fake sweeps whose answers are known (analysis/papers.py)."""

from pathlib import Path

import pytest

from analysis.papers import paper_section
from analysis.sweep import find_runs, group_cells, varying_keys
from tests.helpers import write_fake_run

TWO_COUNTS = "not measured: a fall and a rise again need three completed head counts"
NOISE = (0.0, 0.01, -0.01)  # per seed, shared by every cell: paired differences are exact


def sweep(root: Path, losses: dict[tuple, float], keys: tuple[str, ...], **info) -> list:
    """Cells of a fake sweep: `losses` maps the values of `keys` (model.<key>) to a loss; 3 seeds each."""
    for values, value in losses.items():
        model = dict(zip(keys, values, strict=True))
        for seed, noise in enumerate(NOISE):
            name = "_".join(f"{k}{v}" for k, v in model.items()) + f"_s{seed}"
            n_head, d_k = model.get("n_head", 4), model.get("d_k") or 16
            extra = {"n_head": n_head, "d_k": d_k, "d_model": n_head * d_k, **info}  # h x d_k = d_model, as (A) has
            write_fake_run(root / name, {"seed": seed, "model": model}, value + noise, **extra)
    runs = find_runs(root)
    return group_cells(runs, varying_keys(runs))


def claims(section: str) -> dict[str, str]:
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and line.count(" | ") == 2]
    return {r[0][2:]: r[2][:-2] for r in rows if not r[0].startswith("| claim")}


def test_vaswani_a_agrees_when_one_head_and_sixteen_are_worse(tmp_path):
    cells = sweep(tmp_path, {(1,): 2.30, (2,): 2.12, (4,): 2.10, (8,): 2.11, (16,): 2.20}, ("n_head",))
    section = paper_section("vaswani_a", cells)
    assert "| 16 | 4.91 | +0.0000 | 2.2000 | +0.1000 |" in section and "| 2 | — | — | 2.1200 | +0.0200 |" in section
    assert "Our best head count: 4 (the paper's: 16" in section
    assert claims(section) == {
        "one head is clearly worse than the best head count": "agrees",
        "too many heads is worse again (our most: 16)": "agrees",
    }


def test_vaswani_a_differs_when_most_heads_is_best_and_is_unresolved_when_noisy(tmp_path):
    cells = sweep(tmp_path / "a", {(1,): 2.30, (4,): 2.20, (16,): 2.10}, ("n_head",))
    verdicts = claims(paper_section("vaswani_a", cells))
    assert verdicts["too many heads is worse again (our most: 16)"].startswith("differs")
    two = sweep(tmp_path / "two", {(1,): 2.30, (16,): 2.10}, ("n_head",))
    assert claims(paper_section("vaswani_a", two)) == {
        "one head is clearly worse than the best head count": "agrees",
        # with two counts it compared 16 with 1 again, and read "differs" beside the "agrees" above
        "too many heads is worse again (our most: 16)": TWO_COUNTS,
    }
    for seed, loss in enumerate((2.0, 2.25, 2.1)):  # h=1 worse on one seed, better on another
        write_fake_run(tmp_path / "b" / f"h1_s{seed}", {"seed": seed, "model": {"n_head": 1}}, loss, n_head=1, d_k=32)
        write_fake_run(tmp_path / "b" / f"h4_s{seed}", {"seed": seed, "model": {"n_head": 4}}, 2.1, n_head=4, d_k=8)
    runs = find_runs(tmp_path / "b")
    verdicts = claims(paper_section("vaswani_a", group_cells(runs, varying_keys(runs))))
    assert verdicts["one head is clearly worse than the best head count"] == "unresolved: our interval includes 0"


def test_vaswani_a_refuses_head_counts_at_a_fixed_d_k(tmp_path):
    # Defect: n_head=1,2,4 at model.d_k=4 got the paper's verdicts under the title "heads at d_k = d_model / h"
    cells = sweep(tmp_path, {(1,): 2.3, (2,): 2.2, (4,): 2.1}, ("n_head",), d_k=4, d_model=16)
    with pytest.raises(
        ValueError,
        match=r"^--paper vaswani_a compares head counts at d_k = d_model / h, as Table 3 "
        r"\(A\) does; model.n_head=1 ran d_k 4 at d_model 16: sweep with model.d_k=null, or give",
    ):
        paper_section("vaswani_a", cells)


def test_vaswani_b_checks_each_smaller_d_k_against_the_widest(tmp_path):
    cells = sweep(tmp_path, {(4,): 2.3, (8,): 2.1, (16,): 2.2}, ("d_k",))
    assert claims(paper_section("vaswani_b", cells)) == {
        "reducing d_k from 16 to 4 hurts": "agrees",
        "reducing d_k from 16 to 8 hurts": "differs: ours goes the other way",
    }


def test_vaswani_b_reads_a_null_d_k_as_the_head_size_it_ran_with(tmp_path):
    """model.d_k=null,4,8 (null: d_model / n_head, 16 here) was a TypeError traceback comparing None with 4."""
    section = paper_section("vaswani_b", sweep(tmp_path, {(None,): 2.0, (4,): 2.3, (8,): 2.1}, ("d_k",)))
    assert "| 16 | 5.16 | +0.0476 | 2.0000 | +0.0000 |" in section and "| 4 | — | — | 2.3000 | +0.3000 |" in section
    assert claims(section) == {
        "reducing d_k from 16 to 4 hurts": "agrees",
        "reducing d_k from 16 to 8 hurts": "agrees",
    }


def test_bhojanapalli_compares_the_split_with_a_fixed_head_size(tmp_path):
    losses = {(1, None): 2.3, (8, None): 2.4, (1, 32): 2.25, (8, 32): 2.1}
    verdicts = claims(paper_section("bhojanapalli", sweep(tmp_path, losses, ("n_head", "d_k"))))
    assert verdicts == {
        "at n_head=8, the d_model/h split is worse than head size 32": "agrees",
        "at head size 32, 1 head(s) are worse than 8 (paper: more heads help)": "agrees",
    }


def test_gqa_puts_kv_cache_bytes_beside_the_loss(tmp_path):
    cells = sweep(tmp_path, {(4,): 2.10, (2,): 2.11, (1,): 2.15}, ("n_kv_head",))
    section = paper_section("gqa", cells)
    # 2 (K and V) * 2 layers * n_kv_head * d_k 16 * 2 bytes
    assert "| 4 | 512 | 1.00x | reference |" in section
    assert "| 1 | 128 | 0.25x | +0.0500 [+0.0500, +0.0500] |" in section
    assert claims(section)["0.25x the KV cache costs some loss"] == "agrees"


def test_an_unknown_paper_is_refused():
    with pytest.raises(ValueError, match=r"--paper 'vaswani' is unknown; choose one of: vaswani_a, vaswani_b"):
        paper_section("vaswani", [])


@pytest.mark.parametrize(
    "paper,keys,message",
    [
        ("vaswani_b", ("n_head",), r"--paper vaswani_b needs a sweep over model.d_k; this sweep varies model.n_head"),
        ("bhojanapalli", ("d_k",), r"bhojanapalli needs a sweep over model.n_head; this sweep varies model.d_k"),
        ("bhojanapalli", ("n_head",), r"needs a sweep over model.d_k; this sweep varies model.n_head"),
        ("gqa", ("n_head",), r"--paper gqa needs a sweep over model.n_kv_head; this sweep varies model.n_head"),
    ],
)
def test_a_sweep_without_the_papers_key_is_refused_naming_it(tmp_path, paper, keys, message):
    losses = {(1,): 2.3, (4,): 2.1} if len(keys) == 1 else {}
    with pytest.raises(ValueError, match=message):
        paper_section(paper, sweep(tmp_path, losses, keys))


def test_a_sweep_over_more_keys_than_the_paper_compares_is_refused_naming_them(tmp_path):
    losses = {(h, lr): 2.0 + h / 10 + lr for h in (1, 4) for lr in (0.001, 0.01)}
    cells = sweep(tmp_path, losses, ("n_head", "lr"))  # model.lr stands for any extra swept key
    extra = r"--paper vaswani_a compares cells that differ only in model.n_head; this sweep also varies model.lr"
    with pytest.raises(ValueError, match=extra):
        paper_section("vaswani_a", cells)


def test_vaswani_a_compares_a_best_cell_with_the_next_best_not_by_its_mean_alone(tmp_path):
    """One head best by its mean, within the seed spread of two heads, is unresolved, not 'differs'; a sweep
    whose other cells never finished has nothing to compare (it read 'differs' for both claims)."""
    for seed, (one, two) in enumerate(((2.00, 2.05), (2.10, 2.06), (2.05, 2.07))):
        write_fake_run(tmp_path / "a" / f"h1_s{seed}", {"seed": seed, "model": {"n_head": 1}}, one, n_head=1, d_k=32)
        write_fake_run(tmp_path / "a" / f"h2_s{seed}", {"seed": seed, "model": {"n_head": 2}}, two, n_head=2, d_k=16)
    runs = find_runs(tmp_path / "a")
    assert claims(paper_section("vaswani_a", group_cells(runs, varying_keys(runs)))) == {
        "one head is clearly worse than the best head count": "unresolved: our interval includes 0",
        "too many heads is worse again (our most: 2)": TWO_COUNTS,
    }
    for seed in range(2):
        write_fake_run(tmp_path / "b" / f"h1_s{seed}", {"seed": seed, "model": {"n_head": 1}}, 2.0, n_head=1, d_k=32)
        write_fake_run(tmp_path / "b" / f"h4_s{seed}", {"seed": seed, "model": {"n_head": 4}}, None, n_head=4, d_k=8)
    runs = find_runs(tmp_path / "b")
    verdicts = claims(paper_section("vaswani_a", group_cells(runs, varying_keys(runs))))
    assert set(verdicts.values()) == {"not measured: the sweep has one completed cell, nothing to compare it with"}
