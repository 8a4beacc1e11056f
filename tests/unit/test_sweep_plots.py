"""The ablation report's plots: every title inside its figure, and each says how its values were scored."""

from pathlib import Path

import pytest

import analysis.plots
from analysis.report import choose_reference, differences
from analysis.sweep import find_runs, group_cells, varying_keys
from tests.helpers import write_fake_run


def head_sweep(root: Path) -> list:
    """Two cells of two keys (n_head x d_k), 3 seeds each: labels as long as a head-count sweep's."""
    for n_head, d_k in ((4, 16), (8, 8)):
        for seed in (1, 2, 3):
            config = {"seed": seed, "model": {"n_head": n_head, "d_k": d_k}, "out_dir": f"out/{n_head}/{seed}"}
            write_fake_run(root / f"h{n_head}_s{seed}", config, 2.0 + n_head / 100 + seed / 1000, d_k=d_k)
    runs = find_runs(root)
    return group_cells(runs, varying_keys(runs))


def drawn_titles(cells: list, tmp_path: Path, monkeypatch) -> dict[str, tuple]:
    """{plot: (title text, title's extent, figure's extent)} of each plot, measured as it is saved."""
    drawn = {}

    def measure(fig, path):
        fig.tight_layout()  # as save lays it out
        fig.canvas.draw()
        title = fig.axes[0].title
        drawn[path.stem] = (title.get_text(), title.get_window_extent(), fig.bbox)
        return save(fig, path)

    save = analysis.plots.save
    monkeypatch.setattr(analysis.plots, "save", measure)
    reference = choose_reference(cells, None)
    analysis.plots.plot_intervals(cells, tmp_path / "intervals.png")
    analysis.plots.plot_differences(cells, differences(cells, reference), reference, tmp_path / "differences.png")
    analysis.plots.plot_loss_heatmap(cells, tmp_path / "heatmap.png")
    analysis.plots.plot_val_curves(cells, [r for c in cells for r in c.runs], tmp_path / "curves.png")
    return drawn


@pytest.mark.parametrize("full_val", [False, True])
def test_every_plot_title_fits_its_figure_and_says_how_it_was_scored(tmp_path, monkeypatch, full_val):
    # Defect: the interval plot's title was cut at "red = resolv" (one line wider than its 5-inch figure), and a
    # report scored on every held-out token drew plots that did not say so.
    cells = head_sweep(tmp_path / "sweep")
    if full_val:
        for run in (run for cell in cells for run in cell.runs):
            run.full_val = {"val/loss": run.summary["val/loss"] - 0.1, "val/bpb": 1.0}
    drawn = drawn_titles(cells, tmp_path, monkeypatch)
    assert set(drawn) == {"intervals", "differences", "heatmap", "curves"}
    for plot, (text, title, figure) in drawn.items():
        assert figure.x0 <= title.x0 and title.x1 <= figure.x1 and title.y1 <= figure.y1, f"{plot}: {text!r} is cut"
        # the curves are the loop's evaluations whichever way the final values were scored
        scored = analysis.plots.FULL_VAL if full_val and plot != "curves" else analysis.plots.LOOP_VAL
        assert scored in " ".join(text.split()), f"{plot}: {text!r}"
    assert "red = resolved" in " ".join(drawn["differences"][0].split())
