"""The published results our recipes reproduce, and their claims checked against our cells.

Each claim names two cells and the sign the paper's result gives their loss difference; the verdict
comes from our paired (same-seed) 95% interval: agrees, differs, or unresolved. Nothing here is a
conclusion written in advance: the words are chosen from the numbers.

- Vaswani et al. 2017, "Attention Is All You Need", Table 3 rows (A) and (B) (d_model 512, dev
  perplexity per wordpiece on newstest2013, EN-DE).
- Bhojanapalli et al. 2020, "Low-Rank Bottleneck in Multi-head Attention Models".
- Shazeer 2019 (MQA) and Ainslie et al. 2023 (GQA): fewer key/value heads, a smaller KV cache.
"""

import math
from collections.abc import Callable

from analysis.report import cell_kv_bytes
from analysis.stats import fmt_interval, paired_difference
from analysis.sweep import Cell, matches

VASWANI_A = {1: 5.29, 4: 5.00, 8: 4.92, 16: 4.91, 32: 5.01}  # n_head -> dev PPL, d_k = d_v = 512 / n_head
VASWANI_B = {16: 5.16, 32: 5.01, 64: 4.92}  # d_k -> dev PPL at n_head 8 (d_v stays 64 in the paper)
UNITS = (
    "The paper's gaps are nats per wordpiece of WMT EN-DE translation, ours nats per token of our data: "
    "compare the shape of the two columns, not their sizes."
)


def find(cells: list[Cell], **values: str) -> Cell | None:
    """The one cell whose swept keys (dots written as __) match `values`, or None."""
    wanted = {k.replace("__", "."): v for k, v in values.items()}
    found = [c for c in cells if all(k in c.values and matches(c.values[k], v) for k, v in wanted.items())]
    return found[0] if len(found) == 1 else None


def loss(cell: Cell) -> float:
    values = list(cell.metric("val/loss").values())
    return sum(values) / len(values)


def claim_row(claim: str, a: Cell | None, b: Cell | None, paper_sign: int) -> str:
    """| claim | ours: loss(a) - loss(b) [95% CI] | verdict |; paper_sign: +1 if the paper has a worse than b."""
    if a is None or b is None:
        return f"| {claim} | — | not measured: the sweep lacks one of the two cells |"
    if a is b:
        return f"| {claim} | — | not measured: the sweep has one completed cell, nothing to compare it with |"
    d = paired_difference(a.metric("val/loss"), b.metric("val/loss"))
    ours = f"{a.label()} − {b.label()}: {fmt_interval(d, signed=True)}"
    if d.n < 2:
        verdict = f"cannot tell: {d.n} paired seed(s)"
    elif not d.excludes_zero:
        verdict = "unresolved: our interval includes 0"
    else:
        verdict = "agrees" if (d.mean > 0) == (paper_sign > 0) else "differs: ours goes the other way"
    return f"| {claim} | {ours} | {verdict} |"


def head_size(cell: Cell) -> int:
    """The d_k a cell ran with: its swept model.d_k, or for null (d_model / n_head) what its runs resolved."""
    d_k = cell.values["model.d_k"]
    return cell.info("d_k") if d_k is None else d_k


def published_table(
    cells: list[Cell], value: Callable[[Cell], int], published: dict[int, float], name: str
) -> list[str]:
    """Our mean loss beside the paper's perplexity, each as a gap from its own best (in nats); `value` is the
    cell's value of the paper's knob."""
    best_paper = min(published.values())
    ours = {value(c): c for c in cells if c.metric("val/loss")}
    best_ours = min(map(loss, ours.values())) if ours else math.nan
    lines = [f"| {name} | paper dev PPL | paper ln PPL − best | our val loss | ours − our best |", "|---:" * 5 + "|"]
    for value in sorted(set(published) | set(ours)):
        paper = (
            f"{published[value]:.2f} | {math.log(published[value] / best_paper):+.4f}"
            if value in published
            else "— | —"
        )
        mine = f"{loss(ours[value]):.4f} | {loss(ours[value]) - best_ours:+.4f}" if value in ours else "— | —"
        lines.append(f"| {value} | {paper} | {mine} |")
    return lines


def by_loss(cells: list[Cell]) -> list[Cell]:
    return sorted((c for c in cells if c.metric("val/loss")), key=loss)


def check_split_heads(cells: list[Cell]) -> None:
    """Table 3 (A) keeps h x d_k = d_model: a sweep of head counts at a fixed d_k changes the size with h, which
    is another question (Bhojanapalli's), so its verdicts would not be the paper's."""
    for cell in cells:
        d_model, d_k, n_head = cell.info("d_model"), cell.info("d_k"), cell.values["model.n_head"]
        if None not in (d_model, d_k) and d_k * n_head != d_model:
            raise ValueError(
                f"--paper vaswani_a compares head counts at d_k = d_model / h, as Table 3 (A) does; {cell.label()} "
                f"ran d_k {d_k} at d_model {d_model}: sweep with model.d_k=null, or give --paper bhojanapalli"
            )


def vaswani_a(cells: list[Cell]) -> tuple[list[str], list[str]]:
    check_split_heads(cells)
    heads = sorted(c.values["model.n_head"] for c in cells)
    ranked = by_loss(cells)
    best = ranked[0]

    def best_other_than(cell: Cell | None) -> Cell:
        # A claimed-worse cell that is our best by its mean is compared with the next best, so the verdict
        # still comes from a paired interval: a lead inside the seed spread is unresolved, not "differs".
        return ranked[1] if cell is best and len(ranked) > 1 else best

    one, most = find(cells, model__n_head="1"), find(cells, model__n_head=str(heads[-1]))
    too_many = f"too many heads is worse again (our most: {heads[-1]})"
    rows = [claim_row("one head is clearly worse than the best head count", one, best_other_than(one), +1)]
    if len(ranked) == 2:  # two completed counts: both claims would compare one pair, in opposite directions
        rows.append(f"| {too_many} | — | not measured: a fall and a rise again need three completed head counts |")
    else:
        rows.append(claim_row(too_many, most, best_other_than(most), +1))
    intro = f"Our best head count: {best.values['model.n_head']} (the paper's: 16, with 8 within 0.01 PPL)."
    n_head = published_table(cells, lambda c: c.values["model.n_head"], VASWANI_A, "n_head")
    return [*n_head, "", UNITS, "", intro], rows


def vaswani_b(cells: list[Cell]) -> tuple[list[str], list[str]]:
    sized = sorted(cells, key=head_size)
    widest = sized[-1]
    rows = [
        claim_row(f"reducing d_k from {head_size(widest)} to {head_size(c)} hurts", c, widest, +1)
        for c in sized
        if head_size(c) < head_size(widest)
    ]
    note = "The paper shrinks d_k of queries and keys only (d_v stays 64); here d_k is also the value size."
    return [*published_table(cells, head_size, VASWANI_B, "d_k"), "", UNITS, note], rows


def bhojanapalli(cells: list[Cell]) -> tuple[list[str], list[str]]:
    heads = sorted({c.values["model.n_head"] for c in cells})
    fixed = sorted({c.values["model.d_k"] for c in cells if c.values["model.d_k"] is not None})
    if not fixed:
        return ["The sweep has no fixed head size (model.d_k) to compare with the d_model / n_head split."], []
    size, few, most = str(fixed[-1]), str(heads[0]), str(heads[-1])
    split_most = find(cells, model__n_head=most, model__d_k="null")
    fixed_few, fixed_most = (find(cells, model__n_head=h, model__d_k=size) for h in (few, most))
    split_claim = f"at n_head={most}, the d_model/h split is worse than head size {size}"
    fixed_claim = f"at head size {size}, {few} head(s) are worse than {most} (paper: more heads help)"
    rows = [claim_row(split_claim, split_most, fixed_most, +1), claim_row(fixed_claim, fixed_few, fixed_most, +1)]
    intro = (
        "Paper: with d_k = d_model / h, many heads make each head low-rank (d_k below the sequence length) "
        "and hurt; a fixed head size removes the bottleneck, at more parameters (see the params column)."
    )
    return [intro], rows


def gqa(cells: list[Cell]) -> tuple[list[str], list[str]]:
    """Loss against KV-cache size: MHA (the largest cache, n_kv_head = n_head) is the reference."""
    kv = sorted(cells, key=cell_kv_bytes, reverse=True)
    mha = kv[0]
    lines = ["| n_kv_head | KV bytes/token | KV cache vs MHA | loss − MHA [95% CI] |", "|---:|---:|---:|---:|"]
    rows = []
    for cell in kv:
        d = paired_difference(cell.metric("val/loss"), mha.metric("val/loss"))
        ci = f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]" if d.n > 1 and cell is not mha else "reference"
        ratio = cell_kv_bytes(cell) / cell_kv_bytes(mha)
        lines.append(f"| {cell.values.get('model.n_kv_head')} | {cell_kv_bytes(cell)} | {ratio:.2f}x | {ci} |")
        if cell is not mha:
            rows.append(claim_row(f"{ratio:.2f}x the KV cache costs some loss", cell, mha, +1))
    note = "Papers: MQA (1 KV head) loses a little quality, GQA recovers most; the cache shrinks n_head / n_kv_head x."
    return [*lines, "", note], rows


Builder = Callable[[list[Cell]], tuple[list[str], list[str]]]  # cells -> (intro lines, claim rows)
# name -> (title, the keys its cells differ in, builder)
PAPERS: dict[str, tuple[str, tuple[str, ...], Builder]] = {
    "vaswani_a": ("Vaswani et al. 2017, Table 3 (A): heads at d_k = d_model / h", ("model.n_head",), vaswani_a),
    "vaswani_b": ("Vaswani et al. 2017, Table 3 (B): smaller d_k at fixed heads", ("model.d_k",), vaswani_b),
    "bhojanapalli": (
        "Bhojanapalli et al. 2020: fixed head size vs the d_model / h split",
        ("model.n_head", "model.d_k"),
        bhojanapalli,
    ),
    "gqa": ("Shazeer 2019 / Ainslie et al. 2023: fewer key/value heads", ("model.n_kv_head",), gqa),
}


def check_swept_keys(name: str, needed: tuple[str, ...], swept: list[str]) -> None:
    """The paper's cells differ in `needed` and nothing else: a missing key has nothing to compare, and an
    extra one would make a claim pick one cell per value of the paper's key, hiding the rest."""
    varies = f"this sweep varies {', '.join(swept) or 'nothing'}"
    missing = [k for k in needed if k not in swept]
    if missing:
        raise ValueError(f"--paper {name} needs a sweep over {' and '.join(missing)}; {varies}")
    extra = [k for k in swept if k not in needed]
    if extra:
        raise ValueError(
            f"--paper {name} compares cells that differ only in {' and '.join(needed)}; this sweep also varies "
            f"{', '.join(extra)}: report a folder holding one value of {'/'.join(extra)}, or leave out --paper"
        )


def paper_section(name: str, cells: list[Cell]) -> str:
    """The paper's results beside ours, with a verdict per claim; ValueError for an unknown name or a
    sweep whose swept keys are not the paper's."""
    if name not in PAPERS:
        raise ValueError(f"--paper {name!r} is unknown; choose one of: {', '.join(PAPERS)}")
    title, needed, build = PAPERS[name]
    if not by_loss(cells):
        return f"## {title}\n\nNo completed cell to compare.\n"
    check_swept_keys(name, needed, list(cells[0].values))
    intro, claims = build(cells)
    header = ["| claim (from the paper) | ours: loss difference, nats [95% CI] | verdict |", "|---|---|---|"]
    return "\n".join([f"## {title}", "", *intro, "", *header, *claims]) + "\n"
