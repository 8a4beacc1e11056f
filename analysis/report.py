"""The ablation report in Markdown: one row per cell (the values of every swept key), the mean and 95%
t-interval over seeds, the paired difference against a reference cell, a sentence per comparison,
then every run that did not finish."""

from dataclasses import fields
from pathlib import Path
from typing import Any

from analysis.stats import CONFIDENCE, Interval, fmt_interval, paired_difference, t_interval, verdict
from analysis.sweep import COMPLETED, Cell, Run, matches, schema_defaults, setting, sort_key, varying_keys

FULL_VAL_TEXT = "each run's best checkpoint scored on every held-out token (full val, --full-val)"
LOOP_VAL_TEXT = "final validation values on the run's own eval_batches val batches (curves: the same batches)"


def fmt_count(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def fmt_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text.replace("|", "\\|")


def cell_kv_bytes(cell: Cell) -> int:
    """Bytes one token takes in the cell's KV cache in bf16 (as decoding on an accelerator keeps it), over every
    layer, by the model's own rule (model/kv_cache.py); a formula of the report's own counted MLA as MHA."""
    import torch

    from model.config import GPTConfig
    from model.kv_cache import kv_bytes_per_token

    known = {f.name for f in fields(GPTConfig)}
    config = schema_defaults() | cell.runs[0].config  # a key the run predates ran as its default
    model = {key: config[f"model.{key}"] for key in known if f"model.{key}" in config}
    model |= {key: cell.info(key) for key in ("n_layer", "n_head", "d_model", "d_k") if cell.info(key) is not None}
    return kv_bytes_per_token(GPTConfig(**model), torch.bfloat16)


def choose_reference(cells: list[Cell], spec: dict[str, str] | None) -> Cell | None:
    """The cell every other is compared with: the one matching `spec` ({key: value}), else the first."""
    if not cells:
        return None
    if not spec:
        return cells[0]
    keys = set(cells[0].values)
    unknown = sorted(set(spec) - keys)
    if unknown:
        raise ValueError(f"--reference key(s) {unknown} are not swept; swept keys: {', '.join(sorted(keys)) or 'none'}")
    found = [c for c in cells if all(matches(c.values[k], v) for k, v in spec.items())]
    if len(found) != 1:
        wanted = ", ".join(f"{k}={v}" for k, v in spec.items())
        there = "; ".join(c.label() for c in cells)  # which to give, rather than a count alone
        raise ValueError(f"--reference {wanted} matches {len(found)} cells; it must match exactly one of: {there}")
    return found[0]


def compared_metric(cells: list[Cell]) -> tuple[str, str, str]:
    """(metric, its name, its unit) the cells are compared in: loss in nats per token, or bits per byte where
    their data differ (a swept data.* key): a token of one tokenizer is not a token of another, so a BPE run's
    higher loss per token read as worse while its bits/byte were better."""
    if any(key.startswith("data.") for cell in cells[:1] for key in cell.values):
        return "val/bpb", "bits/byte", "bits/byte"
    return "val/loss", "loss", "nats"


def in_bits(cells: list[Cell]) -> str:
    """The clause that says Δ is in bits/byte, where `compared_metric` chose it."""
    if compared_metric(cells)[0] == "val/loss":
        return ""
    return ", in bits/byte: the runs differ in their data, and a token of one tokenizer is not a token of another"


def differences(cells: list[Cell], reference: Cell | None) -> list[Interval | None]:
    """Paired (same-seed) difference of each cell against the reference, in `compared_metric`; None for the
    reference itself."""
    metric = compared_metric(cells)[0]
    ref = reference.metric(metric) if reference else {}
    return [None if c is reference else paired_difference(c.metric(metric), ref) for c in cells]


def in_order(values) -> list:
    """Numbers in numeric order (seeds 2, 10; not 10, 2 as text), None first, anything else by its text."""
    return sorted(values, key=lambda v: sort_key((v,)))


def table(cells: list[Cell], reference: Cell | None) -> str:
    keys = list(cells[0].values) if cells else []
    # the effective d_k, unless the swept model.d_k column already shows it (it is null where d_model / h)
    show_dk = not ("model.d_k" in keys and all(cell.values["model.d_k"] == cell.info("d_k") for cell in cells))
    head = [*keys, *(["d_k"] if show_dk else []), "params", "FLOPs/token", "KV bytes/token", "steps", "tokens/s"]
    head += ["val loss (nats)", f"Δ {compared_metric(cells)[1]} vs reference", "val bits/byte", "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for cell, diff in zip(cells, differences(cells, reference), strict=True):
        steps = in_order({r.summary.get("step") for r in cell.runs})
        speeds = [r.summary["tokens_per_s"] for r in cell.runs if r.summary.get("tokens_per_s")]
        row = [fmt_value(v) for v in cell.values.values()]
        row += [fmt_value(cell.info("d_k"))] if show_dk else []
        row += [fmt_count(cell.info("params")), fmt_count(cell.info("flops_per_token"))]
        row += [fmt_count(cell_kv_bytes(cell)), "/".join(map(str, steps))]
        row += [fmt_count(sum(speeds) / len(speeds)) if speeds else "—"]
        row += [fmt_interval(t_interval(list(cell.metric("val/loss").values())))]
        row += ["reference" if diff is None else fmt_interval(diff, signed=True)]
        row += [fmt_interval(t_interval(list(cell.metric("val/bpb").values())))]
        row += [", ".join(str(s) for s in in_order(cell.metric("val/loss")))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def comparison_sentences(cells: list[Cell], reference: Cell | None) -> list[str]:
    """One line per cell: its paired difference from the reference in words."""
    out = []
    unit = compared_metric(cells)[2]
    for cell, diff in zip(cells, differences(cells, reference), strict=True):
        if diff is not None and diff.n == 0:  # no mean of no differences: say why there is none
            seeds = [", ".join(map(str, in_order(c.metric("val/loss")))) for c in (cell, reference)]
            out.append(
                f"- {cell.label()} vs {reference.label()}: no paired difference, they share no seed "
                f"(seeds {seeds[0]} against {seeds[1]})."
            )
        elif diff is not None:
            change = f"val loss {diff.mean:+.4f} nats" if unit == "nats" else f"val bits/byte {diff.mean:+.4f}"
            seeds = shared_seeds(cell, reference)
            out.append(f"- {cell.label()} vs {reference.label()}: {change}, {verdict(diff, unit)}{seeds}.")
    return out


def shared_seeds(cell: Cell, reference: Cell) -> str:
    """Which seeds a paired difference used, where the two cells do not have the same ones (the table's seed
    column lists each cell's own, and a mean beside a difference over fewer seeds read as a contradiction)."""
    mine, theirs = set(cell.metric("val/loss")), set(reference.metric("val/loss"))
    if mine == theirs:
        return ""
    both = in_order(mine & theirs)
    return f" (over the {len(both)} seeds both have: {', '.join(map(str, both))})"


def never_started(runs: list[Run], root: Path, plans: dict[Path, int] | None) -> list[str]:
    """A sentence per sweep whose plan (`plans`: {folder: planned jobs}) names jobs that have no directory
    under its folder (a sweep stopped early)."""
    out = []
    for folder, planned in (plans or {}).items():
        have = sum(folder in r.path.parents or r.path == folder for r in runs)
        if planned > have:
            plan = fmt_value((folder / "multirun.yaml").relative_to(root))
            verb = "has" if have == 1 else "have"
            out.append(
                f"{plan} plans {planned} jobs and {have} {verb} a job directory: {planned - have} "
                "never started (the sweep was stopped, or is still running)."
            )
    return out


def unfinished_table(runs: list[Run], root: Path, keys: list[str], plans: dict[Path, int] | None = None) -> str:
    """Every run not in the table, and the planned jobs that never started (`plans`: see `never_started`)."""
    bad = [r for r in runs if r.status != COMPLETED]
    if not bad:
        done = "The one run completed." if len(runs) == 1 else f"All {len(runs)} runs completed."
        return "\n\n".join([done, *never_started(runs, root, plans)])
    lines = [
        *[line for sentence in never_started(runs, root, plans) for line in (sentence, "")],
        f"{len(bad)} of {len(runs)} {'run' if len(runs) == 1 else 'runs'} did not complete with a finite val/loss "
        "(not in the table above):",
        "",
        "| run | " + " | ".join([*keys, "seed"]) + " | status | last logged step | error |",
        "|---|" + "---:|" * (len(keys) + 1) + "---|---:|---|",
    ]
    for r in bad:
        values = " | ".join(fmt_value(setting(r.config, k)) for k in [*keys, "seed"])
        last = "—" if r.last_step is None else r.last_step
        name = fmt_value(r.path.relative_to(root))
        lines.append(f"| {name} | {values} | {r.status} | {last} | {fmt_value(r.error or '—')} |")
    return "\n".join(lines)


def raw_rows(runs: list[Run], keys: list[str], root: Path) -> list[dict[str, Any]]:
    """Every run as the table read it, for the record: its folder, swept values, seed, status, size,
    summary.json and full-val score, so a committed report keeps its numbers' sources beside it."""
    rows = []
    for run in runs:
        info = run.info or {}
        row = {"run": str(run.path.relative_to(root)), **{k: setting(run.config, k) for k in keys}, "seed": run.seed}
        row |= {"status": run.status, "d_k": info.get("d_k"), "params": info.get("params"), "summary": run.summary}
        rows.append(row | ({"full_val": run.full_val} if run.full_val else {}))
    return rows


def swept_none(runs: list[Run]) -> str:
    """What "no key varies" means: one run has nothing to vary; several differ in seed alone."""
    return "none (one run)" if len(runs) == 1 else "none (the runs differ in seed alone)"


def predated_note(runs: list[Run]) -> list[str]:
    """A sentence, and a blank line, when some runs were written before keys the others have."""
    older = [r for r in runs if r.predates]
    if not older:
        return []
    keys = ", ".join(sorted({k for r in older for k in r.predates}))
    return [
        f"{len(older)} of {len(runs)} runs were written before {keys} existed and are read with today's "
        "default there (a new key's default keeps the behaviour it had).",
        "",
    ]


def markdown_report(
    root: Path,
    runs: list[Run],
    cells: list[Cell],
    reference: Cell | None,
    plots: dict[str, str],
    paper: str = "",
    plans: dict[Path, int] | None = None,
    full_val: bool = False,
) -> str:
    """The whole report; `plots` maps a caption to an image path relative to the report; `paper` a section;
    `plans` {sweep folder: jobs its multirun.yaml plans} (analysis.sweep.sweep_plans); `full_val`: the
    runs' scores are their best checkpoints' on every held-out token (analysis/full_val.py)."""
    keys = varying_keys(runs)  # the cells' keys, and still the sweep's where no cell completed
    modes = sorted({r.info["fairness"] for r in runs if r.info and "fairness" in r.info})
    pct = f"{CONFIDENCE:.0%}"
    parts = [
        f"# Ablation: {root.name}",
        "",
        f"Swept keys (every config value that differs across the runs): {', '.join(keys) or swept_none(runs)}. "
        f"Each row aggregates over seeds only. Fairness: {', '.join(modes) or 'unknown'} (studies/fairness.py).",
        "",
        f"Loss and bits/byte are {FULL_VAL_TEXT if full_val else LOOP_VAL_TEXT}: mean [{pct} t-interval over seeds]. "
        f"Δ is the paired difference against the reference ({reference.label() if reference else '—'}) over "
        f"the seeds both share (same seed, same data order), with its t-interval{in_bits(cells)}. KV bytes/token: "
        "what a token takes in the model's KV cache, all layers, in bf16 (keys and values of n_kv_head heads of d_k; "
        "MLA: its latent and rope key). FLOPs/token count matmuls, fwd + bwd.",
        "",
        *predated_note(runs),
        table(cells, reference) if cells else "No run completed.",
        "",
        *comparison_sentences(cells, reference),
        "",
        *([paper] if paper else []),
        unfinished_table(runs, root, keys, plans),
    ]
    for caption, path in plots.items():
        parts += ["", f"![{caption}]({path})"]
    return "\n".join(parts) + "\n"
