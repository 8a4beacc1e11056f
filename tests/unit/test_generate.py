"""GPT.generate / GPT.stream: what they return, seeds, stop tokens, streaming, padding helpers."""

import itertools

import pytest
import torch

from data.tokenizer import BPETokenizer, CharTokenizer
from generation.generate import SamplingParams, encode_prompt, generate, pad_prompts, stream_text, stream_tokens
from model import GPT, GPTConfig

VOCAB = 40


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=2, d_model=32)).eval()


def test_returns_the_prompt_followed_by_new_tokens(model):
    idx = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(0))
    out = generate(
        model,
        idx,
        SamplingParams(12, temperature=1.0, top_k=None, seed=None),
        generator=torch.Generator().manual_seed(0),
    )
    assert out.shape == (3, 17) and out.dtype == torch.long
    assert torch.equal(out[:, :5], idx)
    assert ((out >= 0) & (out < VOCAB)).all()


def test_trainer_call_still_works(model):
    g = torch.Generator().manual_seed(1)
    out = generate(
        model,
        torch.zeros(1, 1, dtype=torch.long),
        SamplingParams(20, temperature=0.8, top_k=200, seed=None),
        generator=g,
    )
    assert out.shape == (1, 21)


@pytest.mark.parametrize("use_cache", [True, False])
def test_same_seed_same_sample(model, use_cache):
    idx = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))

    def run(seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return generate(
            model,
            idx,
            SamplingParams(30, temperature=1.0, top_k=20, top_p=0.9, use_cache=use_cache, seed=None),
            generator=g,
        )

    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))


def test_cached_and_uncached_draw_the_same_sample_from_the_same_seed(model):
    idx = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))
    a = generate(
        model,
        idx,
        SamplingParams(25, top_p=0.9, use_cache=True, temperature=1.0, top_k=None, seed=None),
        generator=torch.Generator().manual_seed(3),
    )
    b = generate(
        model,
        idx,
        SamplingParams(25, top_p=0.9, use_cache=False, temperature=1.0, top_k=None, seed=None),
        generator=torch.Generator().manual_seed(3),
    )
    assert torch.equal(a, b)


def test_stream_yields_the_tokens_generate_returns(model):
    idx = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(0))
    streamed = list(
        stream_tokens(
            model,
            idx,
            SamplingParams(10, temperature=1.0, top_k=None, seed=None),
            generator=torch.Generator().manual_seed(4),
        )
    )
    assert len(streamed) == 10 and all(t.shape == (2,) for t in streamed)
    out = generate(
        model,
        idx,
        SamplingParams(10, temperature=1.0, top_k=None, seed=None),
        generator=torch.Generator().manual_seed(4),
    )
    assert torch.equal(torch.stack(streamed, dim=1), out[:, 3:])


def test_stop_token_ends_generation_and_pads_finished_rows(model):
    idx = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(0))

    def run(prompt: torch.Tensor, stop: int | None) -> torch.Tensor:
        return generate(
            model,
            prompt,
            SamplingParams(30, stop_token=stop, temperature=1.0, top_k=None, seed=None),
            generator=torch.Generator().manual_seed(9),
        )[:, 3:]

    free = run(idx, None)
    first, second = free[0].tolist(), free[1].tolist()
    stop = min(set(first) & set(second), key=lambda t: max(first.index(t), second.index(t)))
    new = run(idx, stop)
    hits = [first.index(stop), second.index(stop)]
    assert new.shape[1] == max(hits) + 1 < 30, "generation ends when the last row produces the stop token"
    for row, hit in enumerate(hits):
        assert torch.equal(new[row, : hit + 1], free[row, : hit + 1])  # same tokens up to the stop
        assert (new[row, hit:] == stop).all()  # then only the stop token
    alone = run(idx[:1], None)[0].tolist()  # a batch of one draws other random numbers: its own reference
    assert run(idx[:1], alone[5]).tolist() == [alone[: alone.index(alone[5]) + 1]]


def test_pad_prompts_left_pads_and_marks_real_tokens():
    idx, mask = pad_prompts([[5, 6, 7], [8]], pad_id=0)
    assert idx.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        pad_prompts([[1], []])


def test_negative_max_new_tokens_and_bad_sampling_are_refused(model):
    idx = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="max_new_tokens=-1 is invalid"):
        generate(model, idx, SamplingParams(-1, temperature=1.0, top_k=None, seed=None))
    with pytest.raises(ValueError, match="top_p=0 is invalid"):
        generate(model, idx, SamplingParams(3, top_p=0, temperature=1.0, top_k=None, seed=None))


def test_engine_with_params_draws_what_generate_draws_with_that_seed(model):
    idx = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=15, temperature=0.9, top_k=10, top_p=0.95, seed=21)
    engine = torch.stack(list(stream_tokens(model, idx, params)), dim=1)
    g = torch.Generator().manual_seed(21)
    assert torch.equal(
        engine,
        generate(model, idx, SamplingParams(15, temperature=0.9, top_k=10, top_p=0.95, seed=None), generator=g)[:, 4:],
    )
    other = torch.stack(list(stream_tokens(model, idx, SamplingParams(max_new_tokens=15, seed=22))), dim=1)
    assert not torch.equal(engine, other)


def test_bad_settings_fail_when_stream_is_called_not_when_first_advanced(model):
    with pytest.raises(ValueError, match="temperature=nan is invalid"):
        stream_tokens(
            model,
            torch.zeros(1, 1, dtype=torch.long),
            SamplingParams(3, temperature=float("nan"), top_k=None, seed=None),
        )
    with pytest.raises(ValueError, match="context_length=0 is invalid"):
        stream_tokens(
            model,
            torch.zeros(1, 1, dtype=torch.long),
            SamplingParams(3, context_length=0, temperature=1.0, top_k=None, seed=None),
        )


@pytest.mark.parametrize(
    "idx,message",
    [
        (torch.zeros(1, 0, dtype=torch.long), r"the prompt idx has shape \(1, 0\); it must be \(B, T\) with T >= 1"),
        (torch.zeros(3, dtype=torch.long), r"the prompt idx has shape \(3,\); it must be \(B, T\) with T >= 1"),
        (torch.full((1, 2), VOCAB), rf"the prompt holds token id {VOCAB}; ids must be in \[0, {VOCAB}\)"),
        (torch.full((1, 2), -1), rf"the prompt holds token id -1; ids must be in \[0, {VOCAB}\)"),
    ],
)
def test_a_prompt_the_model_cannot_read_is_refused_in_one_line(model, idx, message):
    # an empty or 1-D prompt and ids outside the vocabulary were an IndexError or an unpacking error
    # from deep inside (on CUDA a device-side assert)
    for use_cache in (True, False):
        with pytest.raises(ValueError, match=message):
            generate(model, idx, SamplingParams(3, use_cache=use_cache, temperature=1.0, top_k=None, seed=None))
    with pytest.raises(ValueError, match=message):
        next(stream_tokens(model, idx, SamplingParams(max_new_tokens=3)))


def test_encode_prompt_names_unknown_characters_and_refuses_empty_prompts():
    tok = CharTokenizer(" abc")
    assert encode_prompt(tok, "ab c", tok.vocab_size) == [1, 2, 0, 3]
    with pytest.raises(ValueError, match=r"^the prompt cannot be encoded: characters '@', 'Z' are not in") as e:
        encode_prompt(tok, "aZZ@", tok.vocab_size)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="the prompt is empty"):
        encode_prompt(tok, "", tok.vocab_size)
    with pytest.raises(ValueError, match="beyond the model's vocabulary of 3"):
        encode_prompt(tok, "c", 3)


@pytest.mark.parametrize("learned", [False, True])
def test_a_prompt_that_is_not_utf8_is_one_line_naming_where(learned):
    """Bytes that are not UTF-8 reach Python as lone surrogates (argv, stdin); the byte-level BPE raised a
    TypeError traceback on them, which also ended the REPL."""
    tok = BPETokenizer.learn(["ROMEO: cafe and tea\n"] * 4, vocab_size=270) if learned else CharTokenizer(" acef")
    latin1 = b"caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(ValueError, match=r"^the prompt is not UTF-8 text \(byte 0xe9 at character 4\); give UTF-8"):
        encode_prompt(tok, latin1, tok.vocab_size)
    with pytest.raises(ValueError, match=r"\(a lone surrogate U\+D800 at character 1\)"):  # from JSON's \ud800
        encode_prompt(tok, "\ud800", tok.vocab_size)


def test_stream_text_pieces_join_to_the_decoded_tokens(model):
    tok = CharTokenizer("".join(chr(ord("a") + i) for i in range(VOCAB - 1)))
    params = SamplingParams(max_new_tokens=12, seed=5)
    pieces = list(stream_text(model, tok, [1, 2, 3], params))
    ids = [int(t[0]) for t in stream_tokens(model, torch.tensor([[1, 2, 3]]), params)]
    assert "".join(pieces) == tok.decode(ids) and len(pieces) == 12


class ByteTokenizer:
    """Ids are UTF-8 bytes, decoded as byte-level BPE decodes; records the longest list it decoded."""

    longest = 0

    def decode(self, ids: list[int]) -> str:
        self.longest = max(self.longest, len(ids))
        return bytes(ids).decode("utf-8", errors="replace")


def test_stream_text_holds_a_split_character_back_and_decodes_only_the_ids_since_the_last_piece(model, monkeypatch):
    # Defect: every token decoded the whole continuation again, so a long sample took quadratic time.
    text = "héllo ✓ wörld 🙂 " * 20
    ids = list(text.encode())
    monkeypatch.setattr("generation.generate.stream_tokens", lambda *args: iter(torch.tensor([[i]]) for i in ids))
    tok = ByteTokenizer()
    pieces = list(stream_text(model, tok, [1], SamplingParams(max_new_tokens=len(ids))))
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    assert tok.longest == 4  # the 4 bytes of 🙂, never the whole continuation


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("huge,use_cache", [(10**12, True), (10**20, False)])  # 8 TB of buffer; past int64
def test_a_huge_max_new_tokens_streams_tokens_that_see_the_last_block_size(model, huge, use_cache):
    """Nothing is sized to max_new_tokens; 70 tokens run past twice the block_size (32), so the kept
    window slides, and each token is still the argmax of the model on the last 32 tokens."""
    params = SamplingParams(max_new_tokens=huge, temperature=0, use_cache=use_cache)
    ids = [1, 2, 3, 4, 5]
    new = [int(t[0]) for t in itertools.islice(stream_tokens(model, torch.tensor([ids]), params), 70)]
    text = ids + new
    with torch.no_grad():
        for length in range(len(ids), len(text)):  # reference: crop to the window, as nanoGPT does
            logits, _ = model(torch.tensor([text[max(0, length - 32) : length]]))
            assert text[length] == logits[0, -1].argmax().item(), f"token {length} differs"
