"""Learning the byte-level BPE's merges in a child process, from a bounded sample of the train text.

The `tokenizers` trainer holds its process until it is done and lets no signal in (a SIGTERM was still
ignored a minute later), so it runs in a child that the parent kills at once on Ctrl-C, a stop signal
or any error, and that the kernel kills if the parent dies (PR_SET_PDEATHSIG). The parent streams it the
texts through a pipe (4-byte length, then UTF-8), so neither holds the sample twice; the child answers
with the tokenizer's JSON.

This file imports nothing of the project (the child loads it by path, without torch or the rest of `data`),
so the trainer's settings live here, and data.tokenizer.BPETokenizer.learn calls the same learn_spec.

The sample: all of the train text up to BPE_SAMPLE_BYTES (the 4.4 MB Shakespeare train split: all of it,
so its merges are those learned on everything), else pieces of it spread evenly through the corpus, about
BPE_SAMPLE_BYTES in all: the trainer's memory and time grow with the text it counts, and merges learned
on 64 MiB of a corpus differ from those of the whole mostly in its rarest words.
"""

import contextlib
import ctypes
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

BPE_SAMPLE_BYTES = 64 << 20
PR_SET_PDEATHSIG = 1
EOT_TEXT = "<|endoftext|>"
# Loads this file by path as __main__: importing it as data.learn_bpe would import the package, and torch with it.
_RUN_THIS_FILE = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"


def learn_spec(texts: Iterable[str], vocab_size: int, show_progress: bool = False) -> str:
    """tokenizers' JSON of a byte-level BPE of `vocab_size` ids learned from `texts`: EOT, the 256 bytes, merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split, then bytes
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()


def evenly(pieces: Iterable[str], total_bytes: int, budget: int = BPE_SAMPLE_BYTES) -> Iterator[str]:
    """The pieces of a text of `total_bytes`, all if it fits in `budget`, else about `budget` bytes of them spread
    evenly: a piece is kept while the bytes kept so far fall short of budget / total of the bytes seen with it (at
    most one piece over the budget; the first piece is always kept)."""
    if total_bytes <= budget:
        yield from pieces
        return
    seen = kept = 0
    for piece in pieces:
        size = len(piece.encode("utf-8"))
        seen += size
        if kept * total_bytes < seen * budget:
            yield piece
            kept += size


def learn_in_child(
    texts: Iterable[str], vocab_size: int, show_progress: bool, on_bytes: Callable[[int], None] = lambda n: None
) -> str:
    """learn_spec(texts, ...) run in a child process; `on_bytes(n)` after each n bytes sent to it."""
    args = [str(Path(__file__).resolve()), str(vocab_size), str(int(show_progress)), str(os.getpid())]
    command = [sys.executable, "-c", _RUN_THIS_FILE, *args]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        for text in texts:
            data = text.encode("utf-8")
            child.stdin.write(struct.pack("<I", len(data)) + data)
            on_bytes(len(data))
        child.stdin.write(struct.pack("<I", 0))
        child.stdin.close()
        spec = child.stdout.read()
        if child.wait() != 0 or not spec:
            raise RuntimeError(f"learning the BPE failed in its child process (exit status {child.returncode})")
        return spec.decode("utf-8")
    except BrokenPipeError:
        child.wait()
        raise RuntimeError(f"learning the BPE failed in its child process (exit status {child.returncode})") from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _received(stream) -> Iterator[str]:
    while True:
        (size,) = struct.unpack("<I", stream.read(4))
        if size == 0:
            return
        yield stream.read(size).decode("utf-8")


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent still kills it on every way out
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def main(vocab_size: int, show_progress: bool, parent: int) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the whole group: the child just goes
    spec = learn_spec(_received(sys.stdin.buffer), vocab_size, show_progress)
    sys.stdout.buffer.write(spec.encode("utf-8"))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]))
