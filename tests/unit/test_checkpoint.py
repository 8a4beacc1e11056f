"""Checkpoint files: round trip of every piece of state, wrapper prefixes, refusing damaged,
foreign and pickle files (without running them), atomic saves that fail halfway, rotation."""

import dataclasses
import errno
import io
import json
import pickle
import random
import resource
import signal
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn

import rundir.checkpoint
import rundir.files
from data.tokenizer import CharTokenizer
from model import GPT, GPTConfig
from rundir.checkpoint import (
    load_checkpoint,
    load_model_weights,
    looks_like_pickle,
    restore_optimizer,
    restore_rng_state,
    save_checkpoint,
)
from rundir.checkpoints import CheckpointDir
from training.optim import OptimConfig, build_optimizer

CONFIG = GPTConfig(vocab_size=17, block_size=8, n_layer=1, n_head=2, d_model=16)


def trained_pair(seed: int = 0) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(CONFIG)
    optimizer = build_optimizer(model, OptimConfig(), "cpu")
    x = torch.randint(0, 17, (2, 8))
    model(x, x)[1].backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture
def saved(tmp_path) -> Path:
    model, optimizer = trained_pair()
    return save_checkpoint(tmp_path / "ckpt.safetensors", model, optimizer, {"step": 7})


def test_an_optimizer_state_of_other_groups_is_refused_not_loaded(saved):
    # torch loads any state whose group sizes add up; the first step then failed, or updated the wrong tensors
    fresh, _ = trained_pair(seed=1)
    split = list(fresh.parameters())
    other = torch.optim.AdamW([{"params": split[:3], "role": "gain"}, {"params": split[3:], "role": "hidden"}])
    refusal = r"^the checkpoint's optimizer groups \[.*\] are not this run's \[\('gain', 3\)"
    with pytest.raises(ValueError, match=refusal):
        restore_optimizer(other, load_checkpoint(saved))


def test_round_trip_restores_weights_and_optimizer(saved):
    model, optimizer = trained_pair()
    fresh, fresh_optimizer = trained_pair(seed=1)
    ckpt = load_checkpoint(saved)
    load_model_weights(fresh, ckpt)
    restore_optimizer(fresh_optimizer, ckpt)
    for a, b in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True):
        assert a.equal(b)
    assert len(fresh_optimizer.state) == len(optimizer.state) > 0
    for a, b in zip(fresh_optimizer.state.values(), optimizer.state.values(), strict=True):
        assert a.keys() == b.keys() and all(torch.as_tensor(a[k]).equal(torch.as_tensor(b[k])) for k in a)
    assert fresh_optimizer.param_groups[0]["betas"] == optimizer.param_groups[0]["betas"]
    assert ckpt.meta["step"] == 7


def test_rng_streams_continue_exactly(tmp_path):
    model, optimizer = trained_pair()
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    path = save_checkpoint(tmp_path / "c.safetensors", model, optimizer, {"step": 1})
    expected = (torch.rand(3), np.random.rand(3).tolist(), random.random())
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    restore_rng_state(load_checkpoint(path))
    assert torch.rand(3).equal(expected[0])
    assert np.random.rand(3).tolist() == expected[1]
    assert random.random() == expected[2]


class FakeDDP(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def test_compile_and_ddp_prefixes_are_stripped_at_save(tmp_path):
    model, optimizer = trained_pair()
    wrapped = torch.compile(FakeDDP(model))  # not run, so nothing compiles
    assert next(iter(wrapped.state_dict())).startswith("_orig_mod.module.")
    path = save_checkpoint(tmp_path / "c.safetensors", wrapped, optimizer, {"step": 1})
    names = set(load_checkpoint(path).section("model."))
    assert names and not any(n.startswith(("_orig_mod", "module")) for n in names)
    plain = GPT(CONFIG)
    load_model_weights(plain, load_checkpoint(path))
    assert plain.lm_head.weight.equal(model.lm_head.weight)
    assert plain.lm_head.weight is plain.tok_emb.weight  # still tied after loading


def damaged(path: Path, how: str) -> Path:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "bit-flipped":
        data[-20] ^= 0x01  # inside the last tensor's bytes
    elif how == "garbage":
        data = bytearray(b"\x13\x37" * 500)
    elif how == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    "how,message",
    [
        ("truncated", "is corrupt or not a safetensors file"),
        ("bit-flipped", "fails its sha256 check: it was modified or damaged after saving"),
        ("garbage", "is corrupt or not a safetensors file"),
        ("empty", "is corrupt or not a safetensors file"),
    ],
)
def test_damaged_files_are_refused_in_one_line(saved, how, message):
    with pytest.raises(ValueError, match=message) as info:
        load_checkpoint(damaged(saved, how))
    assert "\n" not in str(info.value)


def test_a_checkpoint_replaced_while_it_is_read_is_read_again_not_called_damaged(saved, tmp_path, monkeypatch):
    # Defect: safetensors opens the path twice (header, then weights); a live run's best.safetensors renamed into
    # place between the two paired one file's header with the other's weights: "fails its sha256 check".
    newer = save_checkpoint(tmp_path / "newer.safetensors", *trained_pair(), {"step": 2})
    real_read = rundir.checkpoint.read_checkpoint
    reads = []

    def replaced_during_the_first_read(path, where):
        reads.append(path)
        if len(reads) == 1:
            newer.replace(path)  # the run's rename, between the two opens
            raise ValueError(f"{where} fails its sha256 check: it was modified or damaged after saving")
        return real_read(path, where)

    monkeypatch.setattr(rundir.checkpoint, "read_checkpoint", replaced_during_the_first_read)
    assert load_checkpoint(saved).meta["step"] == 2 and len(reads) == 2
    with pytest.raises(ValueError, match="fails its sha256 check"):  # a damaged file that stays put is refused
        load_checkpoint(damaged(saved, "bit-flipped"))


def test_edited_header_is_refused(saved):
    with open(saved, "rb") as f:
        blob = f.read()
    tensors = safetensors.torch.load(blob)
    metadata = safetensors.safe_open(str(saved), "pt").metadata()
    meta = json.loads(metadata["attnlab"])
    meta["step"] = 10_000  # e.g. a hand edit to skip ahead
    metadata["attnlab"] = json.dumps(meta)
    safetensors.torch.save_file(tensors, str(saved), metadata=metadata)
    with pytest.raises(ValueError, match="fails its sha256 check"):
        load_checkpoint(saved)


def test_foreign_safetensors_file_is_refused(tmp_path):
    path = tmp_path / "foreign.safetensors"
    safetensors.torch.save_file({"wte.weight": torch.zeros(2, 2)}, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="is not an attnlab checkpoint"):
        load_checkpoint(path)


def test_header_length_starting_like_a_pickle_still_loads(tmp_path):
    """safetensors begins with its header length; 0x80 as its low byte is not a pickle."""
    model, optimizer = trained_pair()
    for pad in range(300):  # the header grows with the padding until its length's low byte is 0x80
        path = save_checkpoint(tmp_path / "c.safetensors", model, optimizer, {"step": 1, "pad": "x" * pad})
        if path.read_bytes()[:1] == b"\x80":
            break
    assert path.read_bytes()[:1] == b"\x80"
    assert load_checkpoint(path).meta["pad"] == "x" * pad


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint '.*nope.safetensors' does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")


class Payload:
    """Unpickling this calls Path.touch(marker): proof that a pickle ran, if it ever does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, writer):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.safetensors"
    if writer == "pickle":
        path.write_bytes(pickle.dumps({"model": Payload(marker)}))
    else:
        buffer = io.BytesIO()
        torch.save({"model": Payload(marker)}, buffer)
        path.write_bytes(buffer.getvalue())
    pickle.loads(pickle.dumps(Payload(tmp_path / "control")))  # the payload does work when unpickled
    assert (tmp_path / "control").exists()
    with pytest.raises(ValueError, match=r"is a pickle/torch\.save file; only attnlab safetensors load"):
        load_checkpoint(path)
    assert not marker.exists()


def test_save_failing_halfway_keeps_the_previous_checkpoint(saved, tmp_path):
    """A real partial write: the file-size limit makes write() fail after half the bytes."""
    before = saved.read_bytes()
    model, optimizer = trained_pair(seed=5)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us at the limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, hard))
    try:
        with pytest.raises(
            OSError, match=r"ckpt.safetensors .*it was not written, and its previous version, if any, is intact$"
        ):
            save_checkpoint(saved, model, optimizer, {"step": 8})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert saved.read_bytes() == before
    assert load_checkpoint(saved).meta["step"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"]  # no temp file left


def test_disk_full_is_one_line_and_keeps_the_previous_checkpoint(saved, monkeypatch):
    real_open = open

    class FullDisk(io.FileIO):
        def write(self, data) -> int:
            super().write(bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.files, "open", lambda p, mode: FullDisk(p, "wb"), raising=False)
    model, optimizer = trained_pair(seed=5)
    with pytest.raises(OSError, match=r"no space to write .* \(\d+\.\d MB: No space left on device\)") as info:
        save_checkpoint(saved, model, optimizer, {"step": 8})
    assert "\n" not in str(info.value)
    monkeypatch.setattr(rundir.files, "open", real_open, raising=False)
    assert load_checkpoint(saved).meta["step"] == 7


def test_disk_full_advice_names_a_checkpoint_to_continue_only_where_there_is_one(tmp_path, monkeypatch):
    # Defect: a save that did not fit always said "earlier checkpoints are intact ... continue with
    # resume=auto", also for a fresh run's first checkpoint, where resume=auto was then refused.
    model, optimizer = trained_pair()
    checkpoints = CheckpointDir(tmp_path, keep_last=2)
    real_open = open

    def full(path, mode):
        if "step_0000020" in str(path) or "step_0000030" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode)

    monkeypatch.setattr(rundir.files, "open", full, raising=False)
    with pytest.raises(OSError, match=r"step_0000020.safetensors .*; no checkpoint of this run is saved yet, so there "
                       r"is nothing to resume: free space, then start again with overwrite=true$"):  # fmt: skip
        checkpoints.save(model, optimizer, {"step": 20}, 20, is_best=True)
    checkpoints.save(model, optimizer, {"step": 10}, 10, is_best=True)
    with pytest.raises(OSError, match=r"step_0000030.safetensors .*; step_0000010.safetensors is intact: free space, "
                       r"then continue with resume=auto$"):  # fmt: skip
        checkpoints.save(model, optimizer, {"step": 30}, 30, is_best=False)


def test_keep_last_and_best_are_kept(tmp_path):
    model, optimizer = trained_pair()
    checkpoints = CheckpointDir(tmp_path, keep_last=2)
    for step, is_best in [(10, True), (20, False), (30, True), (40, False)]:
        checkpoints.save(model, optimizer, {"step": step}, step, is_best)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["best.safetensors", "step_0000030.safetensors", "step_0000040.safetensors"]
    assert load_checkpoint(tmp_path / "best.safetensors").meta["step"] == 30


def test_safetensors_header_length_ending_in_0x80_is_not_taken_for_a_pickle():
    # 8-byte little-endian header length 0x5880, then the JSON header: a damaged safetensors file.
    assert not looks_like_pickle(b"\x80\x58\x00\x00\x00\x00\x00\x00{")
    assert not looks_like_pickle(b"\x80\x02\x00\x00\x00\x00\x00\x00{")
    assert looks_like_pickle(pickle.dumps({"a": 1}, protocol=4)[:9])
    assert looks_like_pickle(pickle.dumps([1, 2], protocol=2)[:9])
    assert looks_like_pickle(b"PK\x03\x04rest")


def test_a_dangling_latest_link_says_what_it_points_to(tmp_path):
    # Defect: sample.py outputs/latest after its run was deleted said it "does not exist", with the link right there
    from rundir.checkpoints import find_checkpoint

    (tmp_path / "latest").symlink_to(tmp_path / "2026-12-06" / "gone")
    with pytest.raises(FileNotFoundError, match=r"latest' is a symlink to .*gone, which is missing; give a checkpoint"):
        find_checkpoint(tmp_path / "latest")
    from rundir.records import read_metrics  # plot_run.py's: it said "is not a run directory"

    with pytest.raises(FileNotFoundError, match=r"latest' is a symlink to .*gone, which is missing$"):
        read_metrics(tmp_path / "latest")


def test_a_folder_of_ones_own_named_latest_is_left_and_said(tmp_path, caplog):
    # Defect: a real folder outputs/latest was silently never updated; the README's `outputs/latest` then named it
    import logging

    from cli.run_dirs import point_latest

    (tmp_path / "latest").mkdir()
    (tmp_path / "run").mkdir()
    with caplog.at_level(logging.WARNING):
        point_latest(tmp_path, tmp_path / "run")
    assert (tmp_path / "latest").is_dir() and not (tmp_path / "latest").is_symlink()
    assert "latest is not the link train.py keeps (a folder of its own): left as it is" in caplog.text


# -- a checkpoint checked against itself before anything is built from it -----------------------------------


@pytest.mark.parametrize("optim", [OptimConfig(), OptimConfig(optimizer="muon")])
def test_every_optimizer_state_a_save_writes_has_a_known_shape(optim):
    # restore_optimizer refuses a state key STATE_SHAPES does not name: a new optimizer's keys must be there
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = build_optimizer(model, optim, "cpu")
    x = torch.randint(0, 17, (2, 8))
    model(x, x)[1].backward()
    optimizer.step()
    for state in optimizer.state.values():
        assert state
    shapes = {id(p): tuple(p.shape) for p in model.parameters()}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            assert tuple(torch.as_tensor(value).shape) == rundir.checkpoint.STATE_SHAPES[key](shapes[id(param)])


def test_every_header_field_a_run_writes_is_checked():
    from rundir.run import RunState, checkpoint_meta

    data = type("Data", (), {"tokenizer_meta": {"name": "char"}, "vocab_size": 3, "fingerprint": None})()
    written = checkpoint_meta(RunState(), {"seed": 0}, data, {}).keys() | {"optim_param_groups", "rng", "source"}
    assert written - {"format", "format_version"} <= rundir.checkpoint.HEADER.keys()


def crafted(saved: Path, target: Path, meta=None, tensors=None) -> Path:
    from tests.helpers import rewrite_checkpoint

    def with_config(header: dict) -> None:
        header.setdefault("config", {"model": dataclasses.asdict(CONFIG)})  # what a run's header holds
        header.setdefault("tokenizer", CharTokenizer("abcdefghijklmnop").to_meta())  # 16 characters + <eot>: 17
        if meta is not None:
            meta(header)

    return rewrite_checkpoint(saved, target, meta=with_config, tensors=tensors)


# Each readable by safetensors and whole by its digest; each was trusted (a traceback, an allocation of 51 GB,
# a minute building 3,000 layers, or weights silently converted) before the file was checked against itself.
CRAFTED = {
    "vocab_size=400000000": (
        {"meta": lambda m: m["config"]["model"].update(vocab_size=400_000_000)},
        r"tensor model\.\w+\.weight has shape \(17, 16\); its header's model config builds \(400000000, 16\)",
    ),
    "n_layer=3000": (
        {"meta": lambda m: m["config"]["model"].update(n_layer=3000)},
        r"header field config.model.n_layer=3000, but its weights hold 1 blocks",
    ),
    "d_model=2**40": (
        {"meta": lambda m: m["config"]["model"].update(d_model=2**40)},
        r"tensor model\.\w+\.weight has shape|has a model config this code cannot build",
    ),
    "block_size=2**40": (
        {
            "meta": lambda m: m["config"]["model"].update(block_size=2**40, pos_encoding="rope"),
            "tensors": lambda t: t.pop("model.pos_emb.weight"),  # RoPE's table is sized by block_size, no weight
        },
        r"its header's model config builds [\d,.]+ GiB of weights and tables \(model.block_size=1099511627776\); "
        r"this machine has",
    ),
    "an unknown model field": (
        {"meta": lambda m: m["config"]["model"].update(n_layers=2)},
        r"has a model config this code cannot build \(unknown field model.'n_layers'\)",
    ),
    "n_head a string": (
        {"meta": lambda m: m["config"]["model"].update(n_head="2")},
        r"model.n_head='2' is not int",
    ),
    'step "20"': ({"meta": lambda m: m.update(step="20")}, r"header field step='20' is invalid; it must be a non-neg"),
    "step -5": ({"meta": lambda m: m.update(step=-5)}, r"header field step=-5 is invalid"),
    "step true": ({"meta": lambda m: m.update(step=True)}, r"header field step=True is invalid"),
    "best_val_loss NaN": ({"meta": lambda m: m.update(best_val_loss=float("nan"))}, r"header field best_val_loss"),
    "metrics a list": ({"meta": lambda m: m.update(metrics=[1])}, r"header field metrics=\[1\] is invalid"),
    "rng.torch of 16 bytes": (
        {"tensors": lambda t: t.update({"rng.torch": t["rng.torch"][:16].clone()})},
        r"tensor rng.torch is not a state its generator takes",
    ),
    "rng.python garbage": (
        {"meta": lambda m: m["rng"].update(python=[3, [1, 2, 3], None])},
        r"header field rng.python is not a state its generator takes",
    ),
    "rng.python's gauss a string": (
        {"meta": lambda m: m["rng"]["python"].__setitem__(2, "x")},
        r"header field rng.python is not a state its generator takes \(its cached gauss is 'x'",
    ),
    "rng missing": ({"meta": lambda m: m.pop("rng")}, r"holds no RNG state"),
    "rng.cuda.0 of 5 bytes": (
        {"tensors": lambda t: t.update({"rng.cuda.0": torch.zeros(5, dtype=torch.uint8)})},
        r"tensor rng.cuda.0 has shape \(5,\); a CUDA RNG state is \(16,\)",
    ),
    "F16 weights": (
        {"tensors": lambda t: t.update({"model.ln_f.weight": t["model.ln_f.weight"].half()})},
        r"tensor model.ln_f.weight is torch.float16; this format writes torch.float32 there",
    ),
    "I32 weights": (
        {"tensors": lambda t: t.update({"model.ln_f.weight": t["model.ln_f.weight"].int()})},
        r"tensor model.ln_f.weight is torch.int32; this format writes torch.float32 there",
    ),
    "BF16 optimizer state": (
        {"tensors": lambda t: t.update({"optim.0.exp_avg": t["optim.0.exp_avg"].bfloat16()})},
        r"tensor optim.0.exp_avg is torch.bfloat16",
    ),
    "NaN weights": (
        {"tensors": lambda t: t.update({"model.ln_f.weight": t["model.ln_f.weight"] * float("nan")})},
        r"tensor model.ln_f.weight holds NaN or inf values",
    ),
    "a tensor of another name": (
        {"tensors": lambda t: t.update({"extra": torch.zeros(1)})},
        r"holds tensor 'extra', which this format never writes",
    ),
    "a state of an unknown key": (
        {"tensors": lambda t: t.update({"optim.0.velocity": torch.zeros(1)})},
        r"tensor optim.0.velocity is a state this code does not restore",
    ),
    "a state of no group's parameter": (
        {"tensors": lambda t: t.update({"optim.999.exp_avg": torch.zeros(1)})},
        r"tensor optim.999.exp_avg is for parameter 999, which no group lists",
    ),
    "a weight missing": ({"tensors": lambda t: t.pop("model.ln_f.weight")}, r"missing \['model.ln_f.weight'\]"),
}


@pytest.mark.parametrize("damage", CRAFTED)
def test_a_crafted_checkpoint_is_refused_in_one_line_naming_the_file_and_the_field(saved, tmp_path, damage):
    import time

    changes, message = CRAFTED[damage]
    path = crafted(saved, tmp_path / "crafted.safetensors", **changes)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message) as refused:
        load_checkpoint(path)
    # Before the file was checked, 3,000 layers took 45-61 s to build: the check reads names and a meta build only
    assert time.perf_counter() - start < 10
    assert str(refused.value).startswith(f"checkpoint {str(path)!r}") and "\n" not in str(refused.value)


def test_the_untouched_crafted_copy_loads(saved, tmp_path):
    # the crafting itself (a header with a model config, a recomputed digest) is not what the refusals above refuse
    load_checkpoint(crafted(saved, tmp_path / "crafted.safetensors"))


def test_a_header_from_before_z_loss_went_still_loads(saved, tmp_path):
    # z_loss acted only on the training loss; a header of that time names it, and its weights are the same model
    path = crafted(saved, tmp_path / "old.safetensors", meta=lambda m: m["config"]["model"].update(z_loss=1e-4))
    from analysis.trained import load_model

    model, _ = load_model(path)
    assert not hasattr(model.config, "z_loss") and model.config.n_layer == CONFIG.n_layer


def test_the_lab_refuses_a_crafted_checkpoint_as_a_bad_request_before_building_it(saved, tmp_path, monkeypatch):
    # /api/load answered 500 "internal error" (the allocator's RuntimeError) for a header of vocab_size 400,000,000;
    # a ValueError is the server's 400, with its message
    from lab import api
    from lab.session import LabSession

    changes, message = CRAFTED["vocab_size=400000000"]
    session = LabSession(crafted(saved, tmp_path / "whole.safetensors"), root=tmp_path)
    path = crafted(saved, tmp_path / "crafted.safetensors", **changes)
    monkeypatch.setattr("analysis.trained.GPT", lambda *a: pytest.fail("the model was built before the check"))
    with pytest.raises(ValueError, match=message):
        api.load(session, {"path": str(path)})
