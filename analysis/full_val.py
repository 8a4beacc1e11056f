"""A run's score on every held-out token: its best checkpoint over the whole val split, in non-overlapping
windows of block_size (training.evaluate.split_loss), as bits per byte of the val text. The loop's own
val/loss reads 10 batches drawn with the run's seed, which spread 4.5 times more between seeds (s = 0.0114
against 0.0025 bits/byte over the noise floor's 10 seeds, docs/ablation/noise_floor/), so comparisons that
must resolve small differences use this one.

The score is kept beside the run in RUN/full_val.json with the checkpoint it came from, and computed again
only when that checkpoint changed."""

import json
import math
from pathlib import Path

from analysis.trained import check_checkpoint_data, find_checkpoint, load_model
from data.config import DataConfig
from data.prepare import prepare
from data.text_file import read_json
from rundir.files import atomic_write_bytes
from training.evaluate import split_loss
from training.runtime import autocast, resolve_precision

FULL_VAL = "full_val.json"


# The fp32 logits a scoring batch may hold: windows go as many at a time as fit (at least one). A batch's memory is
# mostly its logits and the pointer's mix over them: the default model (vocab 4096, windows of 4,096) peaked at
# 4.7 GB with batches of 32K tokens and at 0.93 GB one window at a time.
SCORE_LOGIT_BYTES = 64 << 20


def score_checkpoint(path: Path) -> dict:
    """{"val/loss": nats per token, "val/bpb": bits per byte, "params": n, "data": its data config, "step": its
    step} of one checkpoint file."""
    model, ckpt = load_model(path)
    config = ckpt.meta["config"]
    data = prepare(DataConfig(**config["data"]), progress=False)
    # an imported checkpoint's header keeps its tokenizer but no split of its own: scored on the default split's
    # text through that split's tokenizer, it read 3.95 where its run read 3.83
    check_checkpoint_data(
        ckpt.meta, data, "its header does not name the data it was trained on: score the run it came from"
    )
    device = next(model.parameters()).device
    ctx = autocast(device, resolve_precision(config.get("precision", "auto"), device))
    batch_tokens = max(model.config.block_size, SCORE_LOGIT_BYTES // (4 * model.config.vocab_size))
    loss = split_loss(model, data.val, model.config.block_size, device, batch_tokens, precision_ctx=ctx)
    if not math.isfinite(loss):  # finite weights can still overflow: a score of nan is no score (sample.py refuses it)
        raise ValueError(f"checkpoint {str(path)!r} scores a val loss of {loss}: its weights have diverged")
    scored = {"val/loss": loss, "val/bpb": data.bits_per_byte(loss), "params": model.num_params()}
    return scored | {"data": config["data"], "step": ckpt.meta.get("step")}


def checkpoint_stamp(path: Path) -> dict:
    """What identifies the checkpoint a score came from: its name, size and modification time."""
    st = path.stat()
    return {"checkpoint": path.name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def full_val(run_dir: Path) -> dict:
    """The run's full-val score, from RUN/full_val.json when it was made from the run's present best
    checkpoint, else scored now and saved there."""
    run_dir = Path(run_dir)
    ckpt = find_checkpoint(run_dir)
    stamp = checkpoint_stamp(ckpt)
    saved = run_dir / FULL_VAL
    if saved.exists():
        try:
            record = read_json(saved)
        except ValueError:  # torn, foreign or past the bounds (data.text_file): scored again, and replaced
            record = {}
        if isinstance(record, dict) and record.get("from") == stamp:
            return record["score"]
    score = score_checkpoint(ckpt)
    atomic_write_bytes(saved, (json.dumps({"from": stamp, "score": score}, indent=1) + "\n").encode())
    return score
