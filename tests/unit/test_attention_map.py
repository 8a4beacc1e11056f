"""Attention maps: real softmax rows of the model itself, causal, one per layer and head; the script's PNG."""

import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import matplotlib
import pytest
import torch

from analysis.attention import attention_maps, token_label, token_text
from data.tokenizer import BPETokenizer, CharTokenizer
from model import GPT, GPTConfig
from model.attention import expand_kv_heads
from rundir.checkpoint import save_checkpoint
from scripts.attention_map import write_attention_map
from tests.variants import VARIANT_HEADS, backend_variants, variant_model

ROOT = Path(__file__).resolve().parents[2]
VOCAB, T = 40, 12
# (n_head, d_k) over d_model 48, including d_k != d_model / n_head.
HEAD_GRID = [(1, None), (4, None), (3, 10), (2, 5)]


def make_model(backend: str, n_head: int, d_k: int | None, n_layer: int = 3, **variant) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=VOCAB,
        block_size=16,
        n_layer=n_layer,
        n_head=n_head,
        d_model=48,
        d_k=d_k,
        attn_backend=backend,
        **variant,
    )
    return GPT(cfg).eval()


def random_ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "materialized"])
@pytest.mark.parametrize("n_head,d_k", HEAD_GRID)
def test_maps_are_causal_softmax_rows_for_every_layer_and_head(backend, n_head, d_k):
    maps, _ = attention_maps(make_model(backend, n_head, d_k), random_ids())
    assert maps.shape == (3, n_head, T, T)
    torch.testing.assert_close(maps.sum(-1), torch.ones(3, n_head, T))
    above = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert (maps[..., above] == 0).all()
    assert (maps[..., ~above] > 0).all()  # every visible key gets some weight from a softmax
    assert maps[:, :, 0, 0].eq(1).all()  # the first token can only attend to itself


@pytest.mark.parametrize(("backend", "variant"), backend_variants())
def test_the_walk_through_the_blocks_is_the_model(backend, variant):
    model = variant_model(backend, *VARIANT_HEADS, variant, VOCAB, 16)  # its parameters away from their start
    idx = random_ids(1)
    _, logits = attention_maps(model, idx)
    expected, _ = model(idx[None])
    torch.testing.assert_close(logits, expected[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("backend", "variant"), backend_variants())
def test_the_maps_are_what_each_head_reads(backend, variant, monkeypatch):
    # The walk's logits come from the blocks themselves, so they hold even where the maps leave out a change to the
    # scores: each layer's maps times its values must be what its heads return in the model's own forward pass.
    model = variant_model(backend, *VARIANT_HEADS, variant, VOCAB, 16)
    idx = random_ids(1)
    maps, _ = attention_maps(model, idx)
    read: list[tuple[torch.Tensor, torch.Tensor]] = []
    for block in model.blocks:
        attend = block.attn.attend

        def recording(q, k, v, padding_mask=None, attend=attend):
            read.append((v, attend(q, k, v, padding_mask)))
            return read[-1][1]

        monkeypatch.setattr(block.attn, "attend", recording)
    with torch.no_grad():
        model(idx[None])
    assert len(read) == model.config.n_layer
    for layer, (values, heads) in enumerate(read):
        values = expand_kv_heads(values, model.config.n_head)[0]  # (H, T, d_k): each query head's values
        torch.testing.assert_close(maps[layer] @ values, heads[0], atol=1e-5, rtol=1e-5)


def test_maps_differ_between_heads_and_layers_and_see_no_future():
    model = make_model("explicit", 4, None)
    idx = random_ids(2)
    maps, _ = attention_maps(model, idx)
    assert not torch.allclose(maps[0, 0], maps[0, 1]) and not torch.allclose(maps[0, 0], maps[1, 0])
    changed = idx.clone()
    changed[7] = (changed[7] + 1) % VOCAB
    changed_maps, _ = attention_maps(model, changed)
    torch.testing.assert_close(changed_maps[:, :, :7], maps[:, :, :7], atol=0, rtol=0)  # rows before 7 unchanged
    assert not torch.allclose(changed_maps[:, :, 7:], maps[:, :, 7:])


def test_bad_sequences_are_refused():
    model = make_model("sdpa", 2, None)
    with pytest.raises(ValueError, match=r"the sequence has 17 tokens; it needs 1 to block_size=16"):
        attention_maps(model, torch.zeros(17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected one sequence of token ids \(T,\), got shape \(1, 4\)"):
        attention_maps(model, torch.zeros(1, 4, dtype=torch.long))


def test_token_labels_make_whitespace_visible():
    assert [token_label(t) for t in ("a", " ", "\n", "\t", "")] == ["a", "␣", "\\n", "\\t", "∅"]


def test_a_token_holding_part_of_a_character_is_labelled_by_its_bytes():
    # Defect: "naïve" under a byte-level BPE that never merged "ï" was labelled n, a, \ufffd, \ufffd, ve.
    bpe = BPETokenizer.learn(["the naive king\n"] * 20, vocab_size=270)
    ids = bpe.encode("naïve")
    texts = [token_text(bpe, i) for i in ids]
    assert "\\xc3" in texts and "\\xaf" in texts and "\ufffd" not in "".join(texts)
    assert token_text(bpe, bpe.encode("é")[0]) in ("é", "\\xc3")  # a whole character stays itself


def char_checkpoint(tmp_path: Path, n_layer: int = 2, n_head: int = 3) -> Path:
    tokenizer = CharTokenizer("".join(sorted(set("the king is not my lord, sweet love\n"))))
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=n_layer, n_head=n_head, d_model=24, d_k=5)
    torch.manual_seed(0)
    meta = {"step": 7, "config": {"model": asdict(cfg)}, "tokenizer": tokenizer.to_meta()}
    return save_checkpoint(tmp_path / "ckpt.safetensors", GPT(cfg), None, meta)


def test_script_writes_a_png_grid_for_a_checkpoint(tmp_path):
    ckpt = char_checkpoint(tmp_path)
    small = write_attention_map(ckpt, "the king", tmp_path / "small.png")
    # a prompt longer than block_size keeps its last 16 characters
    large = write_attention_map(ckpt, "the king is not my lord, sweet love", tmp_path / "large.png")
    for png in (small, large):
        assert png.read_bytes().startswith(b"\x89PNG")
    assert large.stat().st_size > small.stat().st_size


@pytest.mark.slow
def test_script_cli_reports_an_unknown_character(tmp_path):
    ckpt = char_checkpoint(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "x.png"
    cmd = [sys.executable, "scripts/attention_map.py", str(ckpt), "--prompt", "the QUEEN", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and not out.exists()
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    expected = "error: the prompt cannot be encoded: characters 'E', 'N', 'Q', 'U' are not in the char"
    assert done.stderr.startswith(expected)


def snapshot(directory: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.rglob("*"))}


@pytest.mark.parametrize(
    "args,message",
    [
        (["--device", "foo"], r"^error: device='foo' is invalid; use auto, cpu, cuda, cuda:N or mps \(see --help\)$"),
        (
            ["--out", "TMP/file.txt/attn.png"],
            r"^error: --out '.*file.txt/attn.png' cannot be written: '.*file.txt' is a",
        ),
        (
            ["--out", "TMP/folder"],
            r"^error: --out '.*folder' is a directory; give a file path such as '.*/plot.png'",
        ),
        (["--out", "TMP/attn.docx"], r"^error: --out '.*attn.docx' has suffix '.docx'; use one of .*\.png"),
        (["--prompt", ""], r"^error: the prompt is empty"),
        (["--frobnicate"], r"^error: unrecognized arguments: --frobnicate"),
    ],
)
def test_script_bad_inputs_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    from scripts.attention_map import main

    ckpt = char_checkpoint(tmp_path)
    (tmp_path / "file.txt").write_text("mine")
    (tmp_path / "folder").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([str(ckpt), *(a.replace("TMP", str(tmp_path)) for a in args)])
    text = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err
    assert e.value.code not in (0, None) and len(text.strip().splitlines()) == 1
    assert re.search(message, text.strip()), text
    assert snapshot(tmp_path) == before


def test_a_long_prompt_keeps_the_last_tokens_a_map_draws(tmp_path, caplog, monkeypatch):
    # block_size caps the prompt, and so does MAX_MAP_TOKENS (1,024, here 8): the default's 4,096-token context drew
    # four 4,096 x 4,096 panels a layer, 41 s and 3.3 GB for a picture no wider to the eye
    import scripts.attention_map

    ckpt = char_checkpoint(tmp_path)  # block_size 16
    with caplog.at_level("WARNING", logger="attention_map"):
        write_attention_map(ckpt, "the king is not my lord", tmp_path / "a.png")
        monkeypatch.setattr(scripts.attention_map, "MAX_MAP_TOKENS", 8)
        write_attention_map(ckpt, "the king is not my lord", tmp_path / "b.png")
    assert caplog.messages == [
        "prompt has 23 tokens; keeping the last 16 (block_size=16)",
        "prompt has 23 tokens; keeping the last 8 (a map draws at most 8)",
    ]
    assert (tmp_path / "b.png").stat().st_size < (tmp_path / "a.png").stat().st_size


def test_script_says_exactly_what_it_wrote(tmp_path, caplog):
    from scripts.attention_map import main

    ckpt = char_checkpoint(tmp_path)
    with caplog.at_level("INFO", logger="attention_map"):
        main([str(ckpt), "--prompt", "the king", "--out", str(tmp_path / "maps" / "attn")])
    written = tmp_path / "maps" / "attn.png"
    assert written.read_bytes().startswith(b"\x89PNG") and not (tmp_path / "maps" / "attn").exists()
    assert caplog.messages[-1] == f"wrote {written}"
    assert ckpt.is_file()


def test_an_existing_image_is_replaced_only_with_force(tmp_path, capsys):
    from scripts.attention_map import main

    ckpt = char_checkpoint(tmp_path)
    keep = tmp_path / "keep.png"
    keep.write_text("precious\n")
    for out in (keep, tmp_path / "keep"):  # without a suffix it is the same keep.png
        with pytest.raises(SystemExit) as e:
            main([str(ckpt), "--prompt", "the king", "--out", str(out)])
        assert e.value.code == 1
        assert capsys.readouterr().err == f"error: --out {str(keep)!r} already exists; pass --force to replace it\n"
    assert keep.read_text() == "precious\n"
    main([str(ckpt), "--prompt", "the king", "--out", str(keep), "--force"])
    assert keep.read_bytes().startswith(b"\x89PNG")


def test_a_prompt_with_dollar_signs_is_drawn_as_typed_not_parsed_as_mathtext(tmp_path):
    # matplotlib read "$...$" in the labels and the title as TeX: a bad formula ended the script with
    # an empty "error: " line, a good one was drawn as a formula instead of the prompt's characters
    tokenizer = CharTokenizer("".join(sorted(set("$\\frac{ab}^_ x"))))
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=16)
    meta = {"step": 0, "config": {"model": asdict(cfg)}, "tokenizer": tokenizer.to_meta()}
    ckpt = save_checkpoint(tmp_path / "ckpt.safetensors", GPT(cfg), None, meta)
    png = write_attention_map(ckpt, "$\\frac{a}{b}$ x^", tmp_path / "dollars.png")
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_character_the_font_lacks_is_one_note_not_a_warning_per_glyph(tmp_path, caplog, recwarn):
    # matplotlib wrote "UserWarning: Glyph 127881 ... missing from font(s)" with its own source line, per glyph
    tokenizer = CharTokenizer("".join(sorted(set("hi \U0001f389"))))
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=16)
    meta = {"step": 0, "config": {"model": asdict(cfg)}, "tokenizer": tokenizer.to_meta()}
    ckpt = save_checkpoint(tmp_path / "ckpt.safetensors", GPT(cfg), None, meta)
    with caplog.at_level("INFO", logger="attention_map"), matplotlib.rc_context({"font.family": "DejaVu Sans"}):
        write_attention_map(ckpt, "hi \U0001f389 hi \U0001f389", tmp_path / "emoji.png")  # matplotlib's font has none
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note:")]
    assert notes == ["note: the font has no glyph for '\U0001f389'; drawn as boxes"]
    assert not [w for w in recwarn if "Glyph" in str(w.message)]
