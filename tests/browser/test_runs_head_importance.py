"""The Runs tab's head importance over training: heads as rows, steps as columns, shaded by value; a run
without the file names the command that writes it."""

import json

from analysis.importance_over_training import OUTPUTS
from tests.helpers import write_fake_run

# 2 layers x 1 head at steps 10 and 20; numbers chosen so each table's smallest and largest are known
RESULTS = {
    "run": "run",
    "steps": [10, 20],
    "checkpoints": ["step_0000010.safetensors", "step_0000020.safetensors"],
    "shape": {"n_layer": 2, "n_head": 1},
    "tokens": 256,
    "window": 32,
    "data": "validation split",
    "base_loss": [3.1, 2.9],
    "delta_loss": [[[0.5], [0.01]], [[0.75], [0.02]]],
    "importance": [[[1.0], [1.0]], [[1.0], [1.0]]],  # one head a layer: each is 1 after the per-layer norm
    "importance_raw": [[[0.2], [0.1]], [[0.3], [0.1]]],
}


def test_a_runs_head_importance_is_a_shaded_table_per_measure(page, lab_tmp):
    run = write_fake_run(lab_tmp / "run", {"seed": 1}, 2.0)
    (run / OUTPUTS[0]).write_text(json.dumps(RESULTS))
    page.click("button[data-tab=runs]")
    page.fill("#runs-path", str(run))
    page.click("#runs-form button")
    table = page.wait_for_selector("#runs-importance table[data-measure=delta_loss]")
    rows = [row.inner_text().split("\t") for row in table.query_selector_all("tr")]
    assert rows == [["head \\ step", "10", "20"], ["layer 0 head 0", "0.5000", "0.7500"],
                    ["layer 1 head 0", "0.0100", "0.0200"]]  # fmt: skip
    shades = [cell.evaluate("c => getComputedStyle(c).backgroundColor") for cell in table.query_selector_all("td")]
    assert shades[1] == "rgba(47, 91, 211, 0.8)" and shades[2] == "rgba(47, 91, 211, 0.06)"  # largest, smallest
    assert page.locator("#runs-importance table[data-measure=importance] td").count() == 4
    assert "2 step checkpoints" in page.inner_text("#runs-importance")


def test_a_run_without_the_file_names_the_command(page, lab_tmp):
    run = write_fake_run(lab_tmp / "bare", {"seed": 1}, 2.0)
    page.click("button[data-tab=runs]")
    page.fill("#runs-path", str(run))
    page.click("#runs-form button")
    hint = page.wait_for_selector("#runs-importance p.hint")
    assert f"write it with: python scripts/head_importance.py {run} --over-training" in hint.inner_text()
    assert page.locator("#message").is_hidden()  # not an error: the measurement is simply not made yet
