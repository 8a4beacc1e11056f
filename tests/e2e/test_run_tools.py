"""The tools on a real run: train.py writes a tiny run, then sample.py, convert_hf.py (into a transformers
pipeline), plot_run.py and attention_map.py all take the run directory itself."""

import hashlib
import os
from pathlib import Path

import pytest
import torch

from data.tokenizer import EOT_TEXT
from scripts.attention_map import main as attention_main
from scripts.convert_hf import main as convert_main
from scripts.plot_run import main as plot_main
from scripts.sample import main as sample_main
from tests.helpers import run_cli, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("tools")
    files = write_corpus(base / "corpus")
    overrides = ["+debug=tiny", "data.source=files", "data.tokenizer=char", f"data.files=[{','.join(files)}]"]
    overrides += [f"data.cache_dir={base / 'cache'}", f"out_dir={base / 'run'}", "progress=false", "optim.lr=3e-3"]
    overrides += ["model.pos_encoding=learned", "model.qk_norm=false"]  # GPT-2's layout: the export test needs it
    overrides += [
        "model.tie_embeddings=true",
        "model.attn_gate=null",
        "model.x0_mix=false",
        "model.window_pattern=null",
        "model.bigram_embeds=0",
        "model.pointer_weight=0",
    ]
    done = run_cli(["train.py", *overrides])
    assert done.returncode == 0, done.stderr[-3000:]
    return base / "run"


def test_sample_py_takes_the_run_directory_and_greedy_is_deterministic(run_dir, capsys):
    args = [str(run_dir), "the king ", "--temperature", "0", "--max-new-tokens", "30", "--device", "cpu"]
    sample_main(args)
    first = capsys.readouterr().out
    sample_main(args)
    assert capsys.readouterr().out == first and first.startswith("the king ") and len(first) > 30


def test_the_exported_run_generates_in_transformers_what_sample_py_prints(run_dir, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    convert_main(["export", str(run_dir), str(tmp_path / "hf")])
    capsys.readouterr()
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), device="cpu")
    # 9 + 20 tokens stay within block_size 32: GPT-2 has no positions past it (we would slide the window)
    theirs = pipe("the king ", max_new_tokens=20, do_sample=False)[0]["generated_text"]
    sample_main([str(run_dir), "the king ", "temperature=0", "max_new_tokens=20", "stop_at_eot=true", "device=cpu"])
    ours = capsys.readouterr().out
    assert ours.removesuffix("\n").removesuffix(EOT_TEXT) == theirs  # both stop at end-of-text, if it comes
    assert len(theirs) > len("the king ")


def test_plot_run_and_attention_map_take_the_run_directory(run_dir, tmp_path, capsys):
    plot_main([str(run_dir), "--out", str(tmp_path / "curves.png")])
    attention_main([str(run_dir), "--prompt", "the king", "--out", str(tmp_path / "attn")])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'curves.png'}\n"
    for png in ("curves.png", "attn.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")


def tree(*roots: Path) -> dict[str, str]:
    """sha256 of every file under the roots (symlinks by target): what "byte-identical" compares."""
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_symlink():
                out[str(p)] = "-> " + os.readlink(p)
            elif p.is_file() and p.name != ".lock":
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[str(p)] = "dir"
    return out


# Every CLI over a table of bad inputs ({run}: the finished run, {tmp}: a scratch folder holding
# some_file.txt, folder/, bad.bin (random bytes) and pickle.bin (a torch.save file)).
BAD_INPUTS = [
    (["train.py", "out_dir={run}"], "already holds another run's files"),
    (["train.py", "out_dir={run}", "model.n_head=3"], "must be divisible by model.n_head (3)"),
    (["train.py", "out_dir={run}", "optim.lr=-1"], "optim.lr=-1.0 is invalid"),
    (["train.py", "out_dir={run}", "+model.nhead=4"], "unknown config key model.nhead"),
    (["train.py", "out_dir={run}", "seed=-1"], "seed=-1 is invalid"),
    (["train.py", "out_dir={run}", "resume={tmp}/bad.bin"], "is corrupt or not a safetensors file"),
    (["train.py", "out_dir={run}", "resume={tmp}/pickle.bin"], "is a pickle/torch.save file"),
    (["train.py", "out_dir={tmp}/some_file.txt"], "is a file, not a directory"),
    # what Hydra itself refuses, before train.py's own checks, still comes in one line
    (["train.py", "out_dir={run}", "batch_size=abc"], "batch_size=abc: Value 'abc' of type 'str' could not be"),
    (["train.py", "out_dir={run}", "model=huge"], "Could not find 'model/huge'; available options in 'model': "),
    (["train.py", "out_dir={run}", "model.nhead=4"], "unknown config key model.nhead (did you mean model.n_head?)"),
    # Defect: a recipe's sweep list named on the command line got "did you mean hydra.sweeper.params.model?"
    (
        ["train.py", "-m", "+experiment=vaswani_b_default", "hydra.sweeper.params.model.d_k=32"],
        "hydra.sweeper.params.model.d_k cannot be set from the command line; give the sweep as model.d_k=",
    ),
    (
        ["train.py", "-m", "+experiment=vaswani_b_default", "hydra.sweeper.params.model.d_k=8,16"],
        "hydra.sweeper.params.model.d_k cannot be set from the command line; give the sweep as model.d_k=",
    ),
    (["train.py", "out_dir={run}", "seed=[1"], "cannot parse override 'seed=[1': no viable alternative at input '[1'"),
    (["scripts/sample.py", "{run}", "x", "--temperature", "nan"], "temperature=nan is invalid"),
    (["scripts/sample.py", "{run}", "x", "temperature=inf"], "temperature=inf is invalid"),
    (["scripts/sample.py", "{run}", "x", "--context-length", "0"], "context_length"),
    (["scripts/sample.py", "{run}", "ZZ@"], "not in the char vocabulary"),
    (["scripts/sample.py", "{tmp}/pickle.bin", "x"], "is a pickle/torch.save file"),
    (["scripts/sample.py", "{tmp}/folder", "x"], "holds no checkpoint"),
    (["scripts/sample.py", "{run}", "x", "--no-such-flag"], "unrecognized arguments"),
    (["scripts/convert_hf.py", "export", "{run}", "{tmp}/some_file.txt"], "is an existing file"),
    (["scripts/convert_hf.py", "import", "{tmp}/folder", "{tmp}/x.safetensors"], "no config"),
    (["scripts/attention_map.py", "{run}", "--device", "foo"], "device='foo' is invalid"),
    (["scripts/attention_map.py", "{run}", "--out", "{tmp}/folder"], "is a directory"),
    (["scripts/attention_map.py", "{run}", "--out", "{tmp}/some_file.txt/x.png"], "some_file.txt"),
    (["scripts/ablation_report.py", "{tmp}/some_file.txt"], "is a file"),
    (["scripts/ablation_report.py", "{tmp}/missing"], "does not exist"),
    (["scripts/plot_run.py", "{tmp}/folder"], "is not a run directory"),
    # an empty figure came back, with "wrote ...", exit 0
    (["scripts/plot_run.py", "{tmp}/no_records", "--out", "{tmp}/x.png"], "no metrics to plot: metrics.jsonl of"),
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("scratch")
    (tmp / "some_file.txt").write_text("mine")
    (tmp / "folder").mkdir()
    (tmp / "no_records").mkdir()
    (tmp / "no_records" / "metrics.jsonl").write_text('hello\n{"step": "a"}\n')
    (tmp / "bad.bin").write_bytes(bytes(range(256)) * 8)
    torch.save({"weights": torch.zeros(2)}, tmp / "pickle.bin")
    return tmp


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[" ".join(a[:3]) for a, _ in BAD_INPUTS])
def test_every_cli_refuses_bad_input_in_one_line_and_changes_nothing(run_dir, scratch, args, message):
    before = tree(run_dir, scratch)
    argv = [a.format(run=run_dir, tmp=scratch) for a in args]
    done = run_cli(argv, timeout=180)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and message in errors[0], done.stderr[-2000:]
    assert tree(run_dir, scratch) == before
