"""The analysis tools on bad input a new user met: one `error:` line naming the bad value, a non-zero
exit, no traceback, nothing written or replaced (the README's "Nothing lost" table)."""

import re
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, run_cli, write_fake_run


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def assert_one_error_line(tmp_path: Path, args: list[str], message: str) -> None:
    """Run a script from tmp_path; it must exit non-zero with one matching `error:` line, touching nothing."""
    before = snapshot(tmp_path)
    done = run_cli([str(ROOT / args[0]), *args[1:]], cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("error: ") and re.search(message, lines[0]), lines[0]
    assert snapshot(tmp_path) == before


def head_sweep(root: Path) -> Path:
    """model.n_head 1, 4 x seeds 0, 1: no model.d_k swept."""
    for n_head in (1, 4):
        for seed in (0, 1):
            cfg = {"seed": seed, "model": {"n_head": n_head}}
            write_fake_run(root / "sweep" / f"h{n_head}_s{seed}", cfg, 2.0 + n_head / 10 + seed / 100, n_head=n_head)
    return root / "sweep"


def test_a_paper_whose_key_the_sweep_lacks_is_one_line(tmp_path):
    sweep = head_sweep(tmp_path)
    message = r"--paper vaswani_b needs a sweep over model.d_k; this sweep varies model.n_head$"
    assert_one_error_line(tmp_path, ["scripts/ablation_report.py", str(sweep), "--paper", "vaswani_b"], message)


def test_an_out_directory_under_a_regular_file_is_one_line(tmp_path):
    sweep = head_sweep(tmp_path)
    (tmp_path / "afile").write_text("a file\n")
    message = r"--out 'afile/sub' cannot be written: 'afile' is a file, not a directory"
    assert_one_error_line(tmp_path, ["scripts/ablation_report.py", str(sweep), "--out", "afile/sub"], message)
    assert_one_error_line(tmp_path, ["scripts/head_importance.py", "nowhere", "--out", "afile/sub"], message)


def char_checkpoint(tmp_path: Path) -> Path:
    """An untrained char-level checkpoint with block_size 16: enough for every check before measuring."""
    import torch

    from data.tokenizer import CharTokenizer
    from model import GPT, GPTConfig
    from rundir.checkpoint import save_checkpoint

    tokenizer = CharTokenizer("".join(sorted(set("the king is not my lord, sweet love\n"))))
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=16)
    torch.manual_seed(0)
    meta = {"step": 1, "config": {"model": asdict(cfg), "data": {}}, "tokenizer": tokenizer.to_meta()}
    return save_checkpoint(tmp_path / "ckpt.safetensors", GPT(cfg), None, meta)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--device", "bogus"], r"device='bogus' is invalid; use auto, cpu, cuda, cuda:N or mps \(see --help\)$"),
        (["--text", "bin.txt"], r"--text 'bin.txt' is not UTF-8 text \(byte 4\)$"),
        (["--tokens", "10"], r"--tokens 10 is less than one batch of 8 windows of 16 tokens; give at least 128$"),
        (["--tokens", "10", "--text", "t.txt"], r"--tokens 10 is less than one window of 16 tokens; give at least"),
    ],
)
def test_head_importance_bad_device_text_and_tokens_are_one_line(tmp_path, args, message):
    char_checkpoint(tmp_path)
    (tmp_path / "bin.txt").write_bytes(b"the \xff\xfe king\n" * 10)
    (tmp_path / "t.txt").write_text("the king is not my lord\n" * 10)
    assert_one_error_line(tmp_path, ["scripts/head_importance.py", "ckpt.safetensors", *args, "--out", "hi"], message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
@pytest.mark.parametrize("tool", ["scripts/head_importance.py", "scripts/attention_map.py", "scripts/lab.py"])
def test_a_device_this_machine_lacks_is_a_bad_command_line_in_every_tool(tmp_path, tool):
    # Defect: attention_map.py and head_importance.py exited 1 where sample.py and lab.py exited 2
    char_checkpoint(tmp_path)
    message = r"device='cuda' was asked for but CUDA is not available; use device=auto or cpu \(see --help\)$"
    assert_one_error_line(tmp_path, [tool, "ckpt.safetensors", "--device", "cuda"], message)
    assert run_cli([str(ROOT / tool), "ckpt.safetensors", "--device", "cuda"], cwd=tmp_path).returncode == 2


def test_head_importance_an_out_directory_the_system_refuses_is_one_line(tmp_path):
    # an OSError (here ENAMETOOLONG; a read-only or forbidden directory alike) ended in a traceback
    char_checkpoint(tmp_path)
    message = r"^error: \[Errno 36\] File name too long"
    assert_one_error_line(tmp_path, ["scripts/head_importance.py", "ckpt.safetensors", "--out", "x" * 300], message)


def test_head_importance_a_bad_flag_value_is_one_line_and_exit_2(tmp_path):
    # plain argparse printed its usage lines before the error
    char_checkpoint(tmp_path)
    before = snapshot(tmp_path)
    done = run_cli([str(ROOT / "scripts/head_importance.py"), "ckpt.safetensors", "--tokens", "abc"], cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: argument --tokens: invalid int value: 'abc' (see --help)"
    ]
    assert snapshot(tmp_path) == before
