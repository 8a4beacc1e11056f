"""Distributed training on CPU (gloo, 2 processes): same losses as one process, checkpoints that a
one-process run resumes and scripts/sample.py reads, one run directory, failures that end every
rank instead of hanging."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from cli.argv import hydra_argv
from cli.config import to_train_config
from data.batches import BatchLayout, batch_layout, sample_batch
from generation.generate import SamplingParams
from rundir.checkpoint import load_checkpoint
from scripts.sample import SampleConfig, sample
from tests.e2e.distributed_worker import failing_worker, free_port, json_worker
from tests.helpers import compose_config, run_cli
from training import distributed
from training.distributed import DistInfo, DistributedConfig
from training.setup import train

ROOT = Path(__file__).resolve().parents[2]


# --- batch layout: any world size sees a one-process run's sequences -----------------------------


@pytest.mark.parametrize(
    "batch_size,grad_accum_steps,world_size",
    [(8, 4, 1), (8, 4, 2), (8, 4, 4), (8, 1, 2), (8, 2, 4), (6, 1, 3), (8, 3, 3), (4, 2, 8)],
)
def test_batch_layout_deals_out_the_one_process_batches(batch_size, grad_accum_steps, world_size):
    tokens = np.arange(10_000, dtype=np.uint16)

    def draw(layout: BatchLayout, micro: int, info: DistInfo) -> torch.Tensor:
        micro_step, rows = layout.locate(micro, info)
        return sample_batch(tokens, batch_size, 16, seed=3, step=7, micro_step=micro_step)[0][rows]

    single = batch_layout(batch_size, grad_accum_steps, None, 1)
    expected = torch.cat([draw(single, m, DistInfo()) for m in range(grad_accum_steps)])

    layout = batch_layout(batch_size, grad_accum_steps, None, world_size)
    parts = {}
    for rank in range(world_size):
        info = DistInfo(rank=rank, world_size=world_size)
        for micro in range(layout.accum_steps):
            x = draw(layout, micro, info)
            assert x.shape == (layout.micro_batch, 16)
            parts[micro * world_size + rank] = x
    assert layout.micro_batch * layout.accum_steps * world_size == batch_size * grad_accum_steps
    assert torch.equal(torch.cat([parts[i] for i in sorted(parts)]), expected)


def test_global_batch_size_derives_the_accumulation():
    layout = batch_layout(batch_size=8, grad_accum_steps=1, global_batch_size=64, world_size=2)
    assert (layout.micro_batch, layout.accum_steps, layout.split) == (8, 4, 1)


def test_a_global_batch_that_ranks_cannot_share_is_refused():
    with pytest.raises(ValueError, match="a global batch of 8 sequences cannot be shared evenly by 3 processes"):
        batch_layout(batch_size=8, grad_accum_steps=1, global_batch_size=None, world_size=3)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["global_batch_size=64", "grad_accum_steps=2"], r"global_batch_size=64 and grad_accum_steps=2 are both set"),
        (["global_batch_size=20"], r"global_batch_size=20 is invalid; it must be a positive multiple of batch_size"),
        (["distributed.strategy=zero3"], r"distributed.strategy='zero3' is unknown; choose one of: ddp, fsdp"),
        (["distributed.backend=mpi"], r"distributed.backend='mpi' is unknown"),
        (["distributed.timeout_s=0"], r"distributed.timeout_s=0.0 is invalid"),
    ],
)
def test_bad_distributed_values_are_refused(tiny_run_overrides, overrides, message):
    with pytest.raises(ValueError, match=message):
        to_train_config(compose_config([*tiny_run_overrides, *overrides]))


def test_other_ranks_give_hydra_no_run_directory_of_their_own():
    argv = ["train.py", "max_steps=5", "hydra.output_subdir=mine"]
    assert hydra_argv(argv, DistInfo(rank=0, world_size=2)) == argv
    other = hydra_argv(argv, DistInfo(rank=1, world_size=2))
    assert other[:2] == ["train.py", "max_steps=5"] and "hydra.output_subdir=mine" not in other
    assert {"hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none"} <= set(other)
    # a run's folder is out_dir: Hydra's run directory was made and left empty, the run written elsewhere
    with pytest.raises(ValueError, match=r"^hydra.run.dir=mine does not place the run: give out_dir=mine instead$"):
        hydra_argv(["train.py", "hydra.run.dir=mine"], DistInfo(rank=0, world_size=1))


def test_other_ranks_get_no_log_handler_from_hydra():
    # Defect: ranks other than 0 ran with hydra/job_logging=stdout, a handler beside train.py's own, so each
    # of their warnings (the 'stopped by SIGTERM ... continue with:' line) was printed twice, once on stdout.
    from hydra import compose, initialize_config_dir

    from cli.config import CONFIG_DIR, register_configs

    register_configs()
    overrides = hydra_argv(["train.py", "+debug=tiny"], DistInfo(rank=1, world_size=2))[1:]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        job_logging = compose("config", overrides, return_hydra_config=True).hydra.job_logging
    assert not job_logging.get("handlers") and job_logging.get("root") is None


def test_a_rank_cannot_be_pinned_to_one_gpu():
    with pytest.raises(ValueError, match="device=cuda:1 names one GPU"):
        distributed.local_device(torch.device("cuda:1"), DistInfo(rank=0, world_size=2))


# --- failures: every rank ends with a clear error, none hangs --------------------------------------


def run_workers(worker, tmp_path: Path) -> list[dict]:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, 2, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0, f"worker exit code {p.exitcode}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_failures_end_every_rank_with_a_clear_error(tmp_path):
    rank0, rank1 = run_workers(failing_worker, tmp_path)
    assert rank0["stop"] == rank1["stop"] == 15
    assert rank0["on_main"] == "OSError: no space left to write the checkpoint"
    assert rank1["on_main"] == (
        "RankFailed: rank 0 failed, so rank 1 stops too: OSError: no space left to write the checkpoint"
    )
    assert rank0["timeout"].startswith("raised after"), rank0["timeout"]
    assert float(rank0["timeout"].split()[2].rstrip("s:")) < 5  # the 2 s timeout, not rank 1's 6 s sleep


@pytest.mark.slow
def test_ranks_exchange_values_without_pickle(tmp_path):
    rank0, rank1 = run_workers(json_worker, tmp_path)
    assert rank0["out_dir"] == rank1["out_dir"] == "outputs/run-0 ünïcode"
    assert rank0["max_steps"] == rank1["max_steps"] == 100
    assert rank0["saved"] == "checkpoints/step_0000004.safetensors" and rank1["saved"] is None
    expected = "ranks disagree on the checkpoint to resume: rank 0 has 'path on rank 0', rank 1 has 'path on rank 1'"
    assert rank0["differ"] == rank1["differ"] == f"{expected}; use a shared disk"


# --- 2-process training equals 1-process training ---------------------------------------------------

EXACT = ["precision=fp32", "max_steps=4", "eval_interval=2", "log_interval=1", "optim.warmup_steps=2"]
EXACT += ["optim.average_from=0.25"]  # a weight average (sharded under FSDP) from step 2: saved, resumed, sampled


def losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["train/loss"] for line in lines if "train/loss" in line}


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py")]


def torchrun_env(tmp: Path) -> dict:
    # no_pickle/sitecustomize.py: a training process that unpickles anything fails. TMPDIR: torchrun leaves
    # a torchelastic_* folder in the temporary directory at every launch.
    pythonpath = f"{ROOT / 'tests/e2e/no_pickle'}{os.pathsep}{ROOT}"
    return {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}


def torchrun(overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = torchrun_env(cwd)
    return subprocess.run([*TORCHRUN, *overrides], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,batch",
    [
        ("ddp", ["batch_size=8", "grad_accum_steps=4"]),  # 2 ranks x 2 micro-steps of 8 = 1 process x 4
        # each rank takes half of the one micro-batch; Muon orthogonalises each gathered matrix whole
        ("fsdp", ["batch_size=8", "grad_accum_steps=1"]),
    ],
)
def test_two_processes_match_one_and_their_checkpoint_resumes_in_one(tiny_run_overrides, tmp_path, strategy, batch):
    base = [o for o in tiny_run_overrides if not o.startswith("out_dir=")] + EXACT + batch
    train(to_train_config(compose_config([*base, f"out_dir={tmp_path / 'one'}"])))
    reference = losses(tmp_path / "one")

    # No out_dir: Hydra's outputs/DATE/TIME under cwd, which the ranks must agree on.
    proc = torchrun([*base, f"distributed.strategy={strategy}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dirs = [p.parent for p in (tmp_path / "outputs").glob("20*/*/metrics.jsonl")]
    assert len(run_dirs) == 1 and len(list((tmp_path / "outputs").glob("20*/*"))) == 1  # one directory for both
    two = losses(run_dirs[0])
    assert two.keys() == reference.keys() == set(range(1, 5))
    for step in reference:
        assert two[step] == pytest.approx(reference[step], abs=1e-5), step
    assert proc.stdout.count("--- sample ---") == 1  # rank 0 alone samples and logs
    assert (proc.stdout + proc.stderr).count("(full config: config.yaml)") == 1  # the header, once: rank 0 logs
    # Defect: nothing in a run said how many processes made its tokens/s (the header read as one process's)
    assert f"| cpu x 2 processes ({strategy}) fp32 |" in proc.stdout + proc.stderr
    assert json.loads((run_dirs[0] / "run_info.json").read_text())["world_size"] == 2

    # The 2-process checkpoint is a plain one: sampling loads it, a 1-process run continues it exactly.
    checkpoints = run_dirs[0] / "checkpoints"
    sampling = SamplingParams(max_new_tokens=10)
    sample_cfg = SampleConfig(checkpoint=str(checkpoints / "step_0000004.safetensors"), device="cpu", sampling=sampling)
    samples = sample(sample_cfg, out=io.StringIO())
    assert len(samples) == 1 and len(samples[0]) > len(sample_cfg.prompt)
    two_final = load_checkpoint(checkpoints / "step_0000004.safetensors")
    one_final = load_checkpoint(tmp_path / "one" / "checkpoints" / "step_0000004.safetensors")
    assert_same_weights(two_final, one_final)
    resume = f"resume={checkpoints / 'step_0000002.safetensors'}"
    train(to_train_config(compose_config([*base, f"out_dir={tmp_path / 'resumed'}", resume])))
    resumed = losses(tmp_path / "resumed")
    assert resumed.keys() == {3, 4}
    for step in resumed:
        assert resumed[step] == pytest.approx(reference[step], abs=1e-5), step
    assert_same_weights(load_checkpoint(tmp_path / "resumed" / "checkpoints" / "step_0000004.safetensors"), one_final)


def assert_same_weights(ckpt, reference) -> None:
    """The average (model.*) and the weights training continues from (train.*), tensor by tensor."""
    for section in ("model.", "train."):
        got, want = ckpt.section(section), reference.section(section)
        assert got.keys() == want.keys() and want
        for name, tensor in want.items():
            torch.testing.assert_close(got[name], tensor, atol=1e-5, rtol=0, msg=section + name)


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,message",
    [
        ("model=huge", "error: In 'config': Could not find 'model/huge'"),
        ("model.n_head=3", "error: model.d_model (32) must be divisible by model.n_head (3)"),
        # a traceback per rank ended in torch's "Distributed package doesn't have NCCL built in"
        ("distributed.backend=nccl", "error: distributed.backend=nccl needs CUDA, and this run is on cpu"),
    ],
)
def test_a_bad_override_under_torchrun_is_the_root_cause_torchrun_names(tmp_path, override, message):
    # Defect: torchrun's failure summary after the ranks' line (its own, which a rank cannot stop) gave as
    # the root cause only "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html".
    proc = torchrun(["+debug=tiny", override, "device=cpu", f"out_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith(message) and len(set(errors)) == 1, proc.stderr[-3000:]
    root_cause = proc.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert f"traceback : {errors[0]}" in root_cause, root_cause
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_every_rank_at_one_saved_step(tiny_run_overrides, tmp_path):
    # A constant learning rate, so that the schedule does not depend on max_steps.
    flat_lr = ["optim.warmup_steps=0", "optim.lr=1e-3", "optim.min_lr=1e-3"]
    base = [o for o in tiny_run_overrides if not o.startswith("out_dir=")] + flat_lr
    base += ["precision=fp32", "log_interval=1", "batch_size=8"]
    run = [*base, "max_steps=100000", "eval_interval=100000", f"out_dir={tmp_path / 'two'}"]
    env = torchrun_env(tmp_path)
    proc = subprocess.Popen([*TORCHRUN, *run], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = tmp_path / "two" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended or stalled before step 3"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert stderr.decode().count("stopped by SIGTERM after step") == 1  # Defect: once per rank
    saved = sorted((tmp_path / "two" / "checkpoints").glob("step_*.safetensors"))
    assert len(saved) == 1
    stopped_at = load_checkpoint(saved[0]).meta["step"]
    assert stopped_at == max(losses(tmp_path / "two"))  # every rank stopped after the same step, and it was saved

    # One process continues the 2-process run exactly as an uninterrupted one-process run would.
    resumed = [*base, f"max_steps={stopped_at + 2}", f"resume={saved[0]}", f"out_dir={tmp_path / 'resumed'}"]
    train(to_train_config(compose_config(resumed)))
    train(to_train_config(compose_config([*base, f"max_steps={stopped_at + 2}", f"out_dir={tmp_path / 'one'}"])))
    one, two = losses(tmp_path / "one"), losses(tmp_path / "resumed")
    assert two.keys() == {stopped_at + 1, stopped_at + 2}
    for step in two:
        assert two[step] == pytest.approx(one[step], abs=1e-5), step


def test_several_processes_with_dropout_say_they_match_one_in_distribution_only(tiny_run_overrides, caplog):
    # Defect: the guide promised one process's per-step losses to 1e-5 with no word on dropout, where 2 processes
    # draw masks for half a micro-batch each and ended 0.02 apart after 8 steps
    from training.setup import warn_if_dropout_across_ranks

    cfg = to_train_config(compose_config([*tiny_run_overrides, "model.dropout=0.1"]))
    plain = to_train_config(compose_config(tiny_run_overrides))
    with caplog.at_level("WARNING"):
        warn_if_dropout_across_ranks(plain, DistInfo(rank=0, world_size=2))
        warn_if_dropout_across_ranks(cfg, DistInfo(rank=0, world_size=1))
        assert caplog.records == []
        warn_if_dropout_across_ranks(cfg, DistInfo(rank=0, world_size=2))
    (record,) = caplog.records
    assert record.getMessage().startswith("with dropout (model.dropout=0.1, attention 0.1), 2 processes draw other")


def test_a_collective_failed_by_a_dead_rank_is_one_line_that_says_so_even_under_torchruns_sigterm(capsys):
    # Defect: after one rank was killed (OOM killer, kill -9), rank 0 printed gloo's traceback twice, or, once
    # torchrun's SIGTERM arrived during the unwinding, "stopped by SIGTERM outside the training loop".
    from cli.errors import stop_outside_the_loop
    from training.distributed import DistInfo, RankFailed, lost_peer

    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:27533: Connection reset by peer")
    two = DistInfo(rank=0, local_rank=0, world_size=2)
    lost = lost_peer(gloo, two)
    assert isinstance(lost, RankFailed) and str(lost) == (
        "rank 0: another process of this run stopped mid-step (Connection reset by peer); every step up to the "
        "newest checkpoint is kept: continue with resume=auto"
    )
    assert lost_peer(gloo, DistInfo()) is None and lost_peer(RuntimeError("shape mismatch"), two) is None
    try:
        raise lost
    except RankFailed:
        with pytest.raises(SystemExit) as stopped:  # the SIGTERM while that error unwinds
            stop_outside_the_loop(signal.SIGTERM, None)
    assert stopped.value.code == 143
    assert capsys.readouterr().err == f"error: {lost}\n"
    try:  # a library's own error it handles when the SIGTERM lands is not the reason for the stop
        raise KeyError("a cache miss")
    except KeyError:
        with pytest.raises(SystemExit):
            stop_outside_the_loop(signal.SIGTERM, None)
    assert capsys.readouterr().err.startswith("stopped by SIGTERM outside the training loop")


def rank_env(rank: int, **more: str) -> dict:
    """A plain shell's environment with RANK and WORLD_SIZE left in it (no torchrun)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    return env | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)} | more


LAUNCH = (
    "start every process with torchrun (torchrun --nproc_per_node=2 train.py ...), or unset RANK, WORLD_SIZE and "
    "LOCAL_RANK to train in one process"
)


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_and_world_size_without_torchrun_are_one_line_at_once_naming_them(tiny_run_overrides, rank):
    """Without MASTER_ADDR the run cannot meet its peers: said at once, not as torch's rendezvous message."""
    started = time.monotonic()
    proc = run_cli(["train.py", *tiny_run_overrides, "device=cpu"], env=rank_env(rank), timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"error: RANK={rank} and WORLD_SIZE=2 are set, but MASTER_ADDR and MASTER_PORT are not (torchrun sets all "
        f"of them): {LAUNCH}"
    ]
    assert time.monotonic() - started < 60
    out_dir = next(o.split("=", 1)[1] for o in tiny_run_overrides if o.startswith("out_dir="))
    assert not Path(out_dir).exists(), "no run directory for a run that never began"


@pytest.mark.parametrize(("rank", "reason"), [(0, r"Timed out .* 1/2 clients joined\."), (1, r"nothing listens at")])
def test_a_process_whose_peers_never_come_stops_after_a_bounded_wait_in_one_line(tiny_run_overrides, rank, reason):
    """MASTER_ADDR set by hand and no other process started: the wait was the collective timeout (600 s) and
    ended in a DistStoreError traceback (rank 1: C++ stack frames at every retry)."""
    port = str(free_port())
    env = rank_env(rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    started = time.monotonic()
    overrides = [*tiny_run_overrides, "device=cpu", "distributed.timeout_s=2"]
    proc = run_cli(["train.py", *overrides], env=env, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        rf"error: RANK={rank} and WORLD_SIZE=2 are set, but this process did not meet the other 1 of the run at "
        rf"MASTER_ADDR:MASTER_PORT=127\.0\.0\.1:{port} within 2 s \({reason}.*\): {re.escape(LAUNCH)}",
        lines[0],
    ), lines[0]
    assert time.monotonic() - started < 60


def test_the_wait_for_peers_is_bounded_below_the_collective_timeout(monkeypatch):
    """The default run waits JOIN_S for its peers, not distributed.timeout_s (600 s)."""
    monkeypatch.setattr(distributed, "JOIN_S", 0.5)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    started = time.monotonic()
    group = distributed.process_group(DistributedConfig(), torch.device("cpu"))
    with pytest.raises(ValueError, match=r"did not meet the other 1 of the run .* within 0\.5 s"), group:
        pass
    assert time.monotonic() - started < 10
