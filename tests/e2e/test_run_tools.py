"""The tools on a real run: train.py writes a tiny run, then sample.py, convert_hf.py (into a transformers
pipeline), plot_run.py and attention_map.py all take the run directory itself."""

import pytest

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
    overrides = ["+debug=tiny", "data.source=files", f"data.files=[{','.join(files)}]"]
    overrides += [f"data.cache_dir={base / 'cache'}", f"out_dir={base / 'run'}", "progress=false", "optim.lr=3e-3"]
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


def test_each_tool_run_as_a_file_prints_one_error_line_and_no_traceback(run_dir, tmp_path):
    (tmp_path / "some_file.txt").write_text("mine")
    (tmp_path / "folder").mkdir()
    cases = [
        (["scripts/convert_hf.py", "export", str(run_dir), str(tmp_path / "some_file.txt")], "is an existing file"),
        (["scripts/convert_hf.py", "import", str(tmp_path / "folder"), str(tmp_path / "x.safetensors")], "no config"),
        (["scripts/attention_map.py", str(run_dir), "--device", "foo"], "device='foo' is invalid"),
        (["scripts/attention_map.py", str(run_dir), "--out", str(tmp_path / "folder")], "is a directory"),
        (["scripts/plot_run.py", str(tmp_path / "folder")], "is not a run directory"),
        (["scripts/sample.py", str(run_dir), "x", "temperature=inf"], "temperature=inf is invalid"),
    ]
    before = {p: p.stat().st_mtime_ns for p in [*tmp_path.rglob("*"), *run_dir.rglob("*")]}
    for args, message in cases:
        done = run_cli(args, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode in (1, 2) and done.stdout == "", args
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in [*tmp_path.rglob("*"), *run_dir.rglob("*")]} == before
