"""What scripts/sample.py and its REPL (scripts/sample_repl.py) share: the settings a sample takes
(`SampleConfig`, whose fields are the command line's options and the REPL's commands) and `Sampler`, a
loaded model and tokenizer that samples prompt after prompt."""

if __name__ == "__main__":  # a module: run as a file, its first import of its own package would fail
    raise SystemExit("error: scripts/sampler.py is a module of scripts/sample.py; run: python scripts/sample.py --help")

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from analysis.trained import load_trained
from cli.schema_help import FieldDoc, schema_fields
from generation.generate import (
    MAX_THREADS_PER_CORE,
    SamplingParams,
    check_context_length,
    check_int,
    decode_threads,
    encode_prompt,
    max_threads,
    stream_text,
    torch_threads,
)
from training.runtime import resolve_device

SEPARATOR = "\n---------------\n"
CLI_SAMPLING_FIELDS = [f.name for f in dataclasses.fields(SamplingParams) if f.name != "stop_token"]  # --stop-at-eot


@dataclass
class SampleConfig:
    checkpoint: str = ""  # a checkpoint written by train.py, or a run directory (its best checkpoint)
    prompt: str = "\n"  # the text to continue, as typed; "-" reads it from stdin
    prompt_file: str | None = None  # read the prompt from this UTF-8 file instead
    num_samples: int = 1  # samples per prompt, separated by a line of dashes
    stream: bool | None = None  # print tokens as they are sampled; none = when stdout is a terminal
    interactive: bool = False  # a prompt loop on stdin that loads the model once (:help lists its commands)
    stop_at_eot: bool = False  # end a sample at the tokenizer's end-of-text token
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    cache_dir: str = ""  # tokenizer files (GPT-2 ranks); "" = the checkpoint's data.cache_dir
    # torch CPU threads; none = 1 for a small model (its decode steps are too small to split, and spare
    # threads spin when the CPU is busy), else torch's default; an OMP_NUM_THREADS you set is kept
    threads: int | None = None
    verbose: bool = False  # say on stderr how torch's CPU threads were chosen (their count and how they wait)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def validate(self) -> None:
        """Checks only (the sampling settings checked themselves); ValueError naming the first bad value."""
        if not self.checkpoint:
            raise ValueError("no checkpoint given; pass a checkpoint file or a run directory first")
        if isinstance(self.num_samples, bool) or not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples} is invalid; it must be >= 1")
        if self.threads is not None:  # 10^5 crashed in OpenMP (a segfault, no message)
            most = max_threads()
            rule = f"it must be 1 to {most}, {MAX_THREADS_PER_CORE} per core (or none)"
            check_int("threads", self.threads, 1, most, rule)


def cli_fields() -> list[FieldDoc]:
    """The options sample.py takes: SampleConfig's own fields, then the sampling settings."""
    own = [d for d in schema_fields(SampleConfig) if not d.name.startswith("sampling.")]
    sampling = {d.name: d for d in schema_fields(SamplingParams)}
    return own + [sampling[name] for name in CLI_SAMPLING_FIELDS]


def is_switch(doc: FieldDoc) -> bool:
    """A true/false option (`--stream` / `--no-stream`, `stream=yes`), whether or not it may be left unset."""
    return doc.type in ("bool", "bool | None")


def value_parser(doc: FieldDoc) -> Callable[[str], object]:
    """str -> the field's type; `none`/`null` for an optional field."""
    base = {"int": int, "float": float, "str": str}[doc.type.replace(" | None", "")]
    optional = doc.type.endswith("| None")

    def parse(text: str) -> object:
        if optional and text.strip().lower() in ("none", "null", ""):
            return None
        return base(text)

    parse.__name__ = doc.type.replace(" | None", "")  # argparse names it in "invalid int value: 'x'"
    return parse


def bool_word(key: str, text: str) -> bool:
    words = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
    if text.strip().lower() not in words:
        raise ValueError(f"{key}={text!r} is invalid; it must be true or false")
    return words[text.strip().lower()]


class Sampler:
    """A loaded model and tokenizer, sampling prompt after prompt (the REPL loads once)."""

    def __init__(self, cfg: SampleConfig) -> None:
        cfg.validate()
        self.device = resolve_device(cfg.device)
        trained = load_trained(cfg.checkpoint, self.device, cfg.cache_dir)
        self.model, self.tokenizer, self.path = trained.model, trained.tokenizer, trained.path

    def params(self, cfg: SampleConfig) -> SamplingParams:
        """cfg's settings with the stop token resolved; the context length checked against the model."""
        params = dataclasses.replace(cfg.sampling, stop_token=self.tokenizer.eot_id if cfg.stop_at_eot else None)
        check_context_length(self.model, params.context_length)
        return params

    def sample(self, text: str, cfg: SampleConfig, out: TextIO) -> list[str]:
        """Write cfg.num_samples continuations of `text` to `out`; return them (prompt included).

        Everything that can fail on the user's input is checked before the first write."""
        params = self.params(cfg)
        ids = encode_prompt(self.tokenizer, text, self.model.config.vocab_size)
        generator = params.make_generator(self.device)  # one per call: samples 2..n continue its draws
        stream = is_terminal(out) if cfg.stream is None else cfg.stream
        samples = []
        with torch_threads(decode_threads(self.model, cfg.threads)):
            for i in range(cfg.num_samples):
                if i:
                    out.write(SEPARATOR)
                out.write(text)
                pieces = []
                try:
                    for piece in stream_text(self.model, self.tokenizer, ids, params, self.device, generator):
                        pieces.append(piece)
                        if stream:
                            out.write(piece)
                            out.flush()
                except KeyboardInterrupt:  # Ctrl-C: what was sampled so far is written too, streamed or not
                    out.write(("" if stream else "".join(pieces)) + "\n")
                    out.flush()
                    raise SampleInterrupted from None
                completion = "".join(pieces)
                out.write(("" if stream else completion) + "\n")
                out.flush()
                samples.append(text + completion)
        return samples


class SampleInterrupted(KeyboardInterrupt):
    """Ctrl-C while a sample was being made: its text so far, and the end of its line, are written."""


def is_terminal(out: TextIO) -> bool:
    """Whether `out` is a terminal (a person watching): samples then stream; a pipe or file gets whole ones."""
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
