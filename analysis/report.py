"""The ablation table in Markdown: one row per (n_head, d_k), mean ± std over seeds, then every
run that did not finish."""

from pathlib import Path

from analysis.sweep import COMPLETED, Row, Run, mean_std


def fmt_mean_std(values: list[float], digits: int) -> str:
    mean, std = mean_std(values)
    if not values:
        return "—"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def fmt_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def fmt_steps(steps: list[int]) -> str:
    return str(steps[0]) if len(set(steps)) == 1 else f"{min(steps)}–{max(steps)}"


def table(rows: list[Row]) -> str:
    lines = [
        "| n_head | d_k | n_head·d_k | params | FLOPs/token | steps | tokens/s | val loss (nats) | val bits/byte "
        "| seeds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        tok_s = fmt_count(sum(r.tokens_per_s) / len(r.tokens_per_s)) if r.tokens_per_s else "—"
        lines.append(
            f"| {r.n_head} | {r.d_k} | {r.n_head * r.d_k} | {fmt_count(r.params)} | {fmt_count(r.flops_per_token)} "
            f"| {fmt_steps(r.steps)} | {tok_s} | {fmt_mean_std(r.val_loss, 4)} | {fmt_mean_std(r.val_bpb, 4)} "
            f"| {len(r.runs)} |"
        )
    return "\n".join(lines)


def unfinished_table(runs: list[Run], root: Path) -> str:
    bad = [r for r in runs if r.status != COMPLETED]
    if not bad:
        return f"All {len(runs)} runs completed."
    lines = [
        f"{len(bad)} of {len(runs)} runs did not complete (not in the table above):",
        "",
        "| run | n_head | d_k | seed | status | last logged step | error |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for r in bad:
        error = (r.error or "—").replace("|", "\\|")
        last = "—" if r.last_step is None else r.last_step
        lines.append(
            f"| {r.path.relative_to(root)} | {r.n_head} | {r.d_k} | {r.seed} | {r.status} | {last} | {error} |"
        )
    return "\n".join(lines)


def markdown_report(root: Path, runs: list[Run], rows: list[Row], plots: dict[str, str]) -> str:
    """The whole report; `plots` maps a caption to an image path relative to the report."""
    modes = sorted({r.info["fairness"] for r in runs if r.info})
    parts = [
        f"# Ablation over n_head x d_k: {root.name}",
        "",
        f"Fairness: {', '.join(modes) or 'unknown'} (see training/fairness.py). Loss and bits/byte are the "
        "final validation values, mean ± sample std over seeds; tokens/s is the median over logging "
        "intervals of each run, averaged over seeds; FLOPs/token count matmuls, forward + backward.",
        "",
        table(rows),
        "",
        unfinished_table(runs, root),
    ]
    for caption, path in plots.items():
        parts += ["", f"![{caption}]({path})"]
    return "\n".join(parts) + "\n"
