"""The lab page driven in headless Chromium: it loads, samples, shows the right attention row for the
chosen layer and head (and a variant's window and sink share), shows the loss of a head switched off exactly
as head_gates computes it, and shows errors as a message while the server keeps answering."""

import re
import signal
import threading

import pytest
import torch
import torch.nn.functional as F

from analysis.attention import attention_maps, attention_walk
from analysis.head_mask import gates_without, head_gates
from generation.generate import SamplingParams, generate
from lab.server import make_server, url_of
from lab.session import LabSession
from tests.unit.test_lab import start_lab
from tests.unit.test_lab_variants import SINKS_AND_WINDOW, variant_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
PROMPT = "the king is not what"


def fill_prompt(page, text: str) -> None:
    page.fill("#prompt", text)


def test_page_loads_with_the_model_and_four_tabs(page, session):
    info = page.inner_text("#model-info")
    assert str(session.checkpoint) in info and "2 layers × 2 heads" in info
    assert page.locator(".tabs button").all_inner_texts() == ["Sample", "Attention", "Intervene", "Runs"]
    assert "token" not in page.url, "the token is kept for the tab, not left in the address bar and history"


def test_the_page_without_its_token_says_to_open_the_printed_url(browser, lab_url):
    page = browser.new_page()  # a new context: no token kept from another page
    page.goto(lab_url.split("?")[0])
    message = page.wait_for_selector("#message:not([hidden])").inner_text()
    assert "open the URL the lab printed, with its ?token=" in message
    page.close()


def test_sample_streams_the_same_text_as_generate(page, session):
    fill_prompt(page, PROMPT)
    page.fill("#max_tokens", "40")
    page.fill("#seed", "5")
    page.click("#sample-run")
    page.wait_for_selector("#sample-status:has-text('done')", timeout=30_000)
    shown = page.inner_text("#sample-output .gen-text")
    idx = session.encode(PROMPT)
    generator = torch.Generator().manual_seed(5)
    out = generate(
        session.model, idx[None], SamplingParams(40, temperature=0.8, top_k=200, seed=None), generator=generator
    )
    assert shown and shown == session.tokenizer.decode(out[0, idx.shape[0] :].tolist())
    assert page.inner_text("#sample-output .prompt-text") == PROMPT


def test_stop_ends_a_long_sample_and_frees_the_model_for_the_next_request(page):
    fill_prompt(page, PROMPT)
    page.fill("#max_tokens", "2000")
    page.click("#sample-run")
    page.wait_for_function("document.querySelector('#sample-output .gen-text')?.textContent.length > 0")
    page.click("#sample-stop")
    page.wait_for_selector("#sample-status:has-text('stopped')")
    assert len(page.inner_text("#sample-output .gen-text")) < 2000
    page.click("button[data-tab=attention]")  # needs the model's lock, which the stopped stream held
    page.wait_for_selector("#attn-status:has-text('layer 0')", timeout=20_000)


def shown_row(page, head: int, query: int) -> tuple[list[float], list[str]]:
    """Click `query` in head's strip; return the weights the page shows on keys 0..query and their titles."""
    strip = page.locator(f"#attn-strips .strip[data-head='{head}']")
    strip.locator(f".tok[data-key='{query}']").click()
    page.wait_for_selector(f"#attn-strips .strip[data-head='{head}'] .tok.query[data-key='{query}']")
    keys = strip.locator(".tok")
    weights = [float(keys.nth(k).get_attribute("data-weight")) for k in range(query + 1)]
    titles = [keys.nth(k).get_attribute("title") for k in range(query + 1)]
    assert "future" in keys.nth(query + 1).get_attribute("class"), "keys after the query are masked"
    return weights, titles


def hovered_readout(page, head: int, query: int, key: int) -> str:
    """Hover the map's cell (query, key) and return the readout the page shows for it."""
    canvas = page.locator(f"#attn-maps canvas[data-head='{head}']")
    cell, margin = float(canvas.get_attribute("data-cell")), float(canvas.get_attribute("data-margin"))
    canvas.hover(position={"x": margin + (key + 0.5) * cell, "y": margin + (query + 0.5) * cell})
    text = page.inner_text("#attn-readout")
    assert f"query {query} " in text and f"key {key} " in text, text
    return text


def test_switching_layer_and_head_shows_that_heads_row(page, session):
    fill_prompt(page, PROMPT)
    page.click("button[data-tab=attention]")
    page.wait_for_selector("#attn-status:has-text('layer 0')")
    weights, _ = attention_maps(session.model, session.encode(PROMPT))  # (n_layer, n_head, T, T)
    query = 7
    seen = []
    for layer, head in [(1, 1), (0, 0), (1, 0)]:
        page.select_option("#attn-layer", str(layer))
        page.wait_for_selector(f"#attn-status:has-text('layer {layer}')")
        page.select_option("#attn-head", str(head))
        page.wait_for_selector(f"#attn-maps canvas[data-head='{head}']")
        shown, titles = shown_row(page, head, query)
        expected = weights[layer, head, query, : query + 1].tolist()
        assert shown == pytest.approx(expected, abs=1e-6)
        assert titles[3] == f"key 3 “␣”: {expected[3]:.6f}"
        assert hovered_readout(page, head, query, 4).endswith(f"weight {expected[4]:.6f}")
        seen.append(shown)
    assert seen[0] != pytest.approx(seen[1], abs=1e-4), "two heads with the same row would not test the switch"
    page.select_option("#attn-head", "all")
    assert page.locator("#attn-maps canvas").count() == 2 and page.locator("#attn-strips .strip").count() == 2


@torch.no_grad()
def test_a_head_switched_off_shows_the_loss_head_gates_gives(page, session):
    fill_prompt(page, PROMPT)
    page.fill("#max_tokens", "20")
    page.click("button[data-tab=intervene]")
    page.click(".head-toggle[data-layer='1'][data-head='0']")
    assert page.inner_text("#heads-off-list") == "L1 H0"
    page.click("#intervene-run")
    page.wait_for_selector("#col-ablated .loss")
    idx = session.encode(PROMPT)[None]
    model = session.model
    full = float(F.cross_entropy(model(idx)[0][0, :-1], idx[0, 1:]))
    with head_gates(model, gates_without(model, [(1, 0)])):
        ablated = float(F.cross_entropy(model(idx)[0][0, :-1], idx[0, 1:]))
    shown_full = page.inner_text("#col-full .loss").split()[0]
    shown_ablated = page.inner_text("#col-ablated .loss").split()[0]
    assert (shown_full, shown_ablated) == (f"{full:.4f}", f"{ablated:.4f}")
    assert shown_full != shown_ablated
    assert page.locator("#col-ablated .bar").count() == 10 and page.inner_text("#col-ablated .gen-text")


def test_a_bad_prompt_shows_a_message_and_the_server_still_answers(page):
    fill_prompt(page, "the KING")
    page.click("#sample-run")
    message = page.wait_for_selector("#message:not([hidden])")
    assert re.fullmatch(
        r"the prompt cannot be encoded: characters 'G', 'I', 'K', 'N' are not in the char vocabulary "
        r"\(\d+ characters\)",
        message.inner_text().removesuffix("×").strip(),
    )
    assert "Traceback" not in page.content()
    fill_prompt(page, PROMPT)
    page.click("#sample-run")
    page.wait_for_selector("#sample-status:has-text('done')", timeout=30_000)
    assert page.locator("#message").is_hidden() and page.inner_text("#sample-output .gen-text")


def test_runs_tab_shows_curves_and_the_sweep_table_and_a_missing_run(page, sweep_dir):
    page.click("button[data-tab=runs]")
    assert page.input_value("#runs-path") == str(sweep_dir / "h2"), "prefilled with the model's run"
    page.click("#runs-form button")
    page.wait_for_selector("#runs-chart path[data-series='val/loss']")
    assert page.locator("#runs-chart path[data-series='train/loss']").count() == 1
    page.fill("#runs-path", str(sweep_dir))
    page.click("#runs-form button")
    page.wait_for_selector("#runs-tables table.data")
    header = page.locator("#runs-tables table.data tr").first.inner_text()
    assert header.split("\t")[:2] == ["d_k", "params"]  # one run: no swept key, the report's own columns
    assert page.locator("#runs-tables table.data tr").nth(1).inner_text().split("\t")[:1] == ["16"]
    page.fill("#runs-path", str(sweep_dir / "missing"))
    page.click("#runs-form button")
    assert "does not exist" in page.wait_for_selector("#message:not([hidden])").inner_text()
    # the sweep's chart and table went with it: they stayed under a status naming the missing path
    assert page.locator("#runs-chart > *").count() == 0 and page.locator("#runs-tables > *").count() == 0
    page.fill("#runs-path", "/")
    page.click("#runs-form button")
    page.wait_for_selector("#message-text:has-text('is outside')")  # the machine's other runs stay unlisted


def test_runs_tab_draws_a_curve_of_one_point_and_says_why_a_folder_has_no_table(page, lab_tmp):
    """A run with one evaluation (killed after step 0) was an SVG path of a lone M: nothing drawn. A folder
    of two runs of one config and seed shows their curves and the note, not an empty table."""
    from tests.helpers import write_fake_run

    for name in ("a", "b"):
        write_fake_run(lab_tmp / "outputs" / name, {"seed": 1}, 2.0)  # metrics.jsonl: one val/loss record
    page.click("button[data-tab=runs]")
    page.fill("#runs-path", str(lab_tmp / "outputs" / "a"))
    page.click("#runs-form button")
    page.wait_for_selector("#runs-chart circle[data-series='val/loss']")
    page.fill("#runs-path", str(lab_tmp / "outputs"))
    page.click("#runs-form button")
    page.wait_for_selector("#runs-status:has-text('sweep of 2 runs')")
    assert page.locator("#runs-chart circle").count() == 2
    assert page.locator("#runs-tables table.data").count() == 0
    assert "no ablation table: " in page.inner_text("#runs-tables")


def test_runs_tab_gives_each_cell_of_a_sweep_one_colour_and_one_legend_entry(page, lab_tmp):
    """A 12-run sweep was drawn as 12 lines whose colours repeated (two different cells both blue)."""
    from tests.unit.test_lab import twelve_cells_of_two_seeds

    twelve_cells_of_two_seeds(lab_tmp / "sweep")
    page.click("button[data-tab=runs]")
    page.fill("#runs-path", str(lab_tmp / "sweep"))
    page.click("#runs-form button")
    page.wait_for_selector("#runs-status:has-text('sweep of 24 runs')")
    strokes = page.eval_on_selector_all(
        "#runs-chart path[data-cell]", "ps => ps.map(p => [p.dataset.cell, p.getAttribute('stroke')])"
    )
    assert len(strokes) == 24
    colour_of = {}
    for cell, stroke in strokes:
        assert colour_of.setdefault(cell, stroke) == stroke, f"cell {cell}'s seeds differ in colour"
    assert len(colour_of) == 12 and len(set(colour_of.values())) == 12, "12 cells, 12 colours"
    legend = page.locator("#runs-chart g.legend").all_text_contents()
    assert len(legend) == 12 and all(text.endswith("(2 seeds)") for text in legend), legend
    first = page.locator("#runs-chart g.legend text").first
    assert first.evaluate("t => t.firstChild.textContent") == "d_k=8, n_head=1"  # the keys' last parts
    assert first.locator("title").text_content() == "model.d_k=8, model.n_head=1 (2 seeds)"


def test_opening_a_bad_checkpoint_shows_a_message_and_keeps_the_model(page, session, lab_tmp):
    bad = lab_tmp / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint at all")
    page.fill("#load-path", str(bad))
    page.click("#load-form button")
    assert "is corrupt or not a safetensors file" in page.wait_for_selector("#message:not([hidden])").inner_text()
    assert str(session.checkpoint) in page.inner_text("#model-info")


def test_the_lab_script_prints_its_url_and_serves_the_page(browser, sweep_dir):
    """`python scripts/lab.py RUN --port 0` as a user runs it: the printed URL opens the page on that run."""
    process = start_lab(str(sweep_dir / "h2"), "--port", "0")
    try:
        line = process.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=\S+", line)
        assert url and int(url.group(1)) > 0, (line, process.stderr.read() if process.poll() is not None else "")
        page = browser.new_page()
        page.goto(url.group(0))  # as printed, with its token
        assert "best.safetensors" in page.wait_for_selector("#model-info b").inner_text()
        page.close()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0, "Ctrl-C stops the server cleanly"  # a loaded CI machine is slow


def test_a_setting_the_browser_cannot_read_as_a_number_is_refused_not_sampled_greedily(page):
    """A number field holding text it cannot parse ('1e') reads as "" in JavaScript, which the API takes as
    temperature 0: the page sampled greedily and said 'done'. It now names the field instead."""
    fill_prompt(page, PROMPT)
    page.fill("#max_tokens", "10")
    page.click("#temperature", click_count=3)
    page.keyboard.type("1e")
    page.click("#sample-run")
    message = page.wait_for_selector("#message:not([hidden])").inner_text()
    assert "temperature" in message and "not a number" in message, message
    assert "done" not in page.inner_text("#sample-status")


def test_a_narrow_window_keeps_the_attention_map_readable_and_nothing_wider_than_the_page(page):
    """At a phone's width the fixed 260 px legend column squeezed the maps to a sliver, and the Open and Runs
    fields (300 and 480 px) made the page scroll sideways."""
    page.set_viewport_size({"width": 375, "height": 800})
    fill_prompt(page, PROMPT)
    page.click("button[data-tab=attention]")
    page.wait_for_selector("#attn-status:has-text('layer 0')", timeout=20_000)
    assert page.locator("#attn-maps").bounding_box()["width"] > 250
    for tab in ("sample", "attention", "intervene", "runs"):
        page.click(f"button[data-tab={tab}]")
        wide = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert wide <= 0, f"{tab}: the page is {wide} px wider than the window"


def test_browser_back_and_forward_move_between_tabs_and_a_reload_keeps_the_tab(page):
    """The tabs were not in the history: Back after switching tabs left the lab (to the previous site or a
    blank page), and a reload always went back to Sample."""
    shown = lambda: page.evaluate("document.body.dataset.tab")  # noqa: E731
    page.click("button[data-tab=attention]")
    page.click("button[data-tab=runs]")
    page.go_back()
    page.wait_for_function("document.body.dataset.tab === 'attention'")
    assert page.locator("#tab-attention").is_visible() and page.locator("#tab-runs").is_hidden()
    page.go_back()
    page.wait_for_function("document.body.dataset.tab === 'sample'")
    assert page.url.startswith("http://127.0.0.1"), "still on the lab"
    page.go_forward()
    page.wait_for_function("document.body.dataset.tab === 'attention'")
    page.reload()
    page.wait_for_selector("#model-info b")
    assert shown() == "attention" and page.locator("#tab-attention").is_visible()


def test_a_small_next_token_probability_is_shown_with_its_digits_not_as_zero(page):
    """An untrained or wide-vocabulary model's top 10 are each under 0.05%: every bar read '0.0%'."""
    page.evaluate(
        "renderResult('col-full', {loss: 1.5, sample: '',"
        " top: [{token: 'a', p: 2.34e-4}, {token: 'b', p: 0.5}]}, null, 'x')"
    )
    assert page.locator("#col-full .pv").all_inner_texts() == ["0.023%", "50.0%"]


def test_a_prompt_edited_while_compare_runs_does_not_relabel_the_result(page):
    """The samples were shown after the prompt read when the answer came, not the prompt they continue."""
    fill_prompt(page, PROMPT)
    page.fill("#max_tokens", "300")
    page.click("button[data-tab=intervene]")
    page.click("#intervene-run")
    fill_prompt(page, "edited meanwhile")
    page.wait_for_selector("#col-ablated .output", timeout=30_000)
    assert page.locator("#col-full .prompt-text").inner_text() == PROMPT


def test_a_model_with_sinks_and_a_window_shows_the_sink_share_and_the_windows_band(browser, tmp_path):
    """The attention tab of a variant model: the window named per layer and its band masked (the keys before
    it hatched like the future), and each head's line 'sink 23.4%', its share of the weight as the walk reads it."""
    session = LabSession(variant_checkpoint(tmp_path / "sinks.safetensors", **SINKS_AND_WINDOW))
    server = make_server(session)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    page, errors = browser.new_page(viewport={"width": 1280, "height": 900}), []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url_of(server))
        page.wait_for_selector("#model-info b")
        assert page.locator("#attn-layer option").all_inner_texts() == ["0 (window 4)", "1"]
        fill_prompt(page, PROMPT)
        page.click("button[data-tab=attention]")
        page.wait_for_selector("#attn-status:has-text('layer 0 · window 4')")
        walk = attention_walk(session.model, session.encode(PROMPT))
        query, head = 7, 3
        page.select_option("#attn-head", str(head))
        line = page.wait_for_selector(f"#attn-maps .variant-line[data-head='{head}']")
        share = walk.sink_share[0, head]  # (T,)
        assert line.inner_text() == f"sink {100 * float(share.mean()):.1f}%"
        strip = page.locator(f"#attn-strips .strip[data-head='{head}']")
        strip.locator(f".tok[data-key='{query}']").click()
        page.wait_for_selector(f"#attn-strips .strip[data-head='{head}'] .tok.query[data-key='{query}']")
        outside = [k for k in range(query) if "outside" in (strip.locator(".tok").nth(k).get_attribute("class"))]
        assert outside == [0, 1, 2, 3], "query 7 sees keys 4..7 only"
        shown = [float(strip.locator(".tok").nth(k).get_attribute("data-weight")) for k in range(4, query + 1)]
        reading = float(strip.locator(".query-readings").get_attribute("data-sink"))
        assert reading == pytest.approx(float(share[query]), abs=1e-6)
        assert sum(shown) + reading == pytest.approx(1.0, abs=1e-5), "the window's weights and the sink make the row"
        assert "masked (before the window of 4)" in hovered_readout(page, head, query, 2)
        page.select_option("#attn-layer", "1")
        page.wait_for_selector("#attn-status:has-text('layer 1')")
        assert "window" not in page.inner_text("#attn-status")
        assert page.locator("#attn-strips .tok.outside").count() == 0
        line = page.wait_for_selector(f"#attn-maps .variant-line[data-head='{head}']")
        assert line.inner_text() == f"sink {100 * float(walk.sink_share[1, head].mean()):.1f}%"
    finally:
        page.close()
        server.shutdown()
        server.server_close()
    assert not errors, f"JavaScript errors on the page: {errors}"
