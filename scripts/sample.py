"""Sample text from a trained checkpoint or run directory; the prompt goes in exactly as typed.

    python scripts/sample.py outputs/latest "ROMEO: But soft, what light"
    python scripts/sample.py RUN_DIR "KING (aside): [Exit]" --temperature 0 --max-new-tokens 500 --stream
    python scripts/sample.py RUN_DIR/checkpoints/best.safetensors --prompt-file start.txt --num-samples 3 --seed 7
    echo "ROMEO:" | python scripts/sample.py outputs/latest -      # "-" reads the prompt from stdin
    python scripts/sample.py outputs/latest -i                     # interactive: load once, prompt after prompt
    python scripts/sample.py checkpoint=CKPT prompt="ROMEO:" temperature=0 stream=true   # key=value works too

A run directory gives its checkpoints/best.safetensors (else its newest step checkpoint). Every
option may be written `--max-new-tokens 9`, `--max_new_tokens=9` or `max_new_tokens=9`; a prompt
that itself looks like `word=value` goes after `--` or in `--prompt` (`RUN temperature=0` is the
option, sampled from the default prompt, and says so on stderr). On a terminal the text streams as it
is sampled; piped or redirected, each sample is written whole (the same text). The text goes to stdout; a
problem the user can fix prints one line `error: ...` on stderr before anything else and exits
non-zero: 2 for a bad command line (an unknown option, a value an option does not take, a device this
machine lacks, options that conflict), 1 for what it names (a file, the checkpoint and the settings it
cannot take, such as a context_length past its block_size, the prompt).
"""

import argparse
import difflib
import os
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

if __package__ in (None, ""):  # run as a file (python scripts/sample.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training.threads  # isort: skip  (before torch: OpenMP reads its wait policy once)
from cli.errors import exit_quietly_on_ctrl_c, exit_with_error, replace_unencodable

with exit_quietly_on_ctrl_c():  # torch takes seconds to import
    from cli.schema_help import FieldDoc, OneLineParser, show_default
    from data.text_file import MAX_TEXT_BYTES, decode_text, read_text_file
    from generation.generate import SamplingParams
    from scripts.sample_repl import repl
    from scripts.sampler import (
        CLI_SAMPLING_FIELDS,
        SampleConfig,
        Sampler,
        bool_word,
        cli_fields,
        is_switch,
        value_parser,
    )
    from training.runtime import resolve_device

# --- the command line: options generated from the schema, so --help cannot drift from it ---


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(  # unset options stay out of the namespace (SUPPRESS), so `--top-k none` is seen
        prog="scripts/sample.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.unrecognized_hint = "a prompt that starts with '-' goes last, after --: sample.py RUN -- '-x'"
    parser.extra_word_hint = "the prompt is one argument: quote it whole, sample.py RUN 'ROMEO: But soft'"
    parser.add_argument("checkpoint_pos", nargs="?", metavar="CHECKPOINT_OR_RUN_DIR", help="as --checkpoint")
    parser.add_argument("prompt_pos", nargs="?", metavar="PROMPT", help='as --prompt ("-" reads stdin)')
    for doc in cli_fields():
        flag = "--" + doc.name.replace("_", "-")
        meaning = f"{doc.help} (default: {show_default(doc.default)})"
        if is_switch(doc):
            flags = ("-i", flag) if doc.name == "interactive" else (flag,)
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, help=meaning)
        else:
            metavar = doc.type.replace(" | None", "").upper()
            parser.add_argument(flag, type=value_parser(doc), metavar=metavar, help=meaning)
    return parser


def normalize_argv(argv: Iterable[str]) -> list[str]:
    """Map the spellings users try onto the flags: `key=value` (the Hydra style this script had),
    `+key=value` (OneLineParser maps `--key_name`). Left alone: words after `--` (prompts that look
    like options), the word after a flag that takes a value (`--prompt x=1` is that prompt), and an
    existing path (a run directory named `lr=3`)."""
    return read_argv(argv)[0]


def read_argv(argv: Iterable[str]) -> tuple[list[str], list[str]]:
    """normalize_argv's words, and the `key=value` words it read as options (in order)."""
    fields = {d.name: d for d in cli_fields()}
    out: list[str] = []
    options: list[str] = []
    words = list(argv)
    for n, word in enumerate(words):
        if word == "--":
            out += words[n:]
            break
        if n > 0 and takes_value(words[n - 1], fields):
            out.append(word)
            continue
        match = re.fullmatch(r"\+?([A-Za-z_][A-Za-z0-9_]*)=(.*)", word, flags=re.DOTALL)
        if not match:
            out.append(word)
            continue
        key, value = match.groups()
        if key not in fields and is_existing_path(word):
            out.append(word)
            continue
        if key not in fields:
            hint = difflib.get_close_matches(key, fields, n=1)
            suggestion = f" (did you mean {hint[0]}?)" if hint else ""
            raise ValueError(f"unknown option {key!r}{suggestion} (see --help); {as_text(word)}")
        options.append(word)
        flag = "--" + key.replace("_", "-")
        if is_switch(fields[key]):
            out.append(flag if bool_word(key, value) else "--no-" + flag[2:])
        else:
            out.append(f"{flag}={value}")
    return out, options


def as_text(word: str) -> str:
    """How to give `word` as the prompt instead: after `--`, or in --prompt, quoted for the shell."""
    if len(word) > 40 or not word.isprintable():  # the error stays one short line
        return "to sample it as the text, write it after -- or give it in --prompt"
    quoted = f"'{word}'" if "'" not in word else shlex.quote(word)
    return f"to sample the text instead, write -- {quoted} or --prompt {quoted}"


def prompt_slot_note(argv: list[str], cfg: SampleConfig) -> str | None:
    """One line when no prompt was given but a `key=value` word was read as an option: `sample.py RUN
    temperature=0` samples greedily from the default prompt, which a user meaning the text should hear."""
    if cfg.interactive or cfg.prompt_file is not None or cfg.prompt != SampleConfig.prompt:
        return None
    options = [w.lstrip("+") for w in read_argv(argv)[1]]
    if any(w.startswith("prompt=") for w in options):  # prompt=<newline>, the default, given on purpose
        return None
    options = [w for w in options if not w.startswith("checkpoint=")]
    if not options:
        return None
    read = f"note: read {options[0]} as an option and no prompt was given, so the sample starts from {cfg.prompt!r}"
    return f"{read}; {as_text(options[0])}"


def takes_value(word: str, fields: dict[str, FieldDoc]) -> bool:
    """Whether `word` is a flag whose value is the next word: `--prompt`, `--max_new_tokens`, or an
    abbreviation argparse accepts (`--prompt-f`), not `--stream` nor `--seed=3`."""
    if not word.startswith("--") or "=" in word:
        return False
    flags = {"--" + name.replace("_", "-"): not is_switch(doc) for name, doc in fields.items()}
    flag = word.replace("_", "-")
    if flag in flags:
        return flags[flag]
    matches = [takes for name, takes in flags.items() if name.startswith(flag)]
    return bool(matches) and all(matches)


def is_existing_path(word: str) -> bool:
    try:
        return Path(word).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def parse_args(argv: list[str]) -> SampleConfig:
    """The command line -> a validated SampleConfig; ValueError (exit 2 in main) for a bad one."""
    # intermixed: positionals may come after options (`RUN --seed 3 "ROMEO:"`, `RUN --temperature 0 -- a=b`)
    given = vars(build_parser().parse_intermixed_args(normalize_argv(argv)))
    for name in ("checkpoint", "prompt"):
        if f"{name}_pos" not in given:
            continue
        positional = given.pop(f"{name}_pos")
        if name in given and positional != given[name]:
            raise ValueError(f"{name} is given twice ({positional!r} and --{name} {given[name]!r}); give it once")
        given[name] = positional
    refuse_conflicting_prompts(given)
    sampling = SamplingParams(**{k: given.pop(k) for k in CLI_SAMPLING_FIELDS if k in given})
    cfg = SampleConfig(**given, sampling=sampling)
    cfg.validate()
    resolve_device(cfg.device)  # checked here, so a bad device is a bad option like any other
    return cfg


def refuse_conflicting_prompts(given: dict[str, object]) -> None:
    """One source of prompts: PROMPT (or --prompt), --prompt-file, or -i's stdin; never one silently dropped."""
    sources = {"PROMPT": given.get("prompt"), "--prompt-file": given.get("prompt_file")}
    named = [f"{source} {value!r}" for source, value in sources.items() if value is not None]
    if given.get("interactive") and named:
        raise ValueError(f"-i reads its prompts from stdin, so {named[0]} would be ignored; give one or the other")
    if len(named) > 1:
        raise ValueError(f"the prompt is given twice ({' and '.join(named)}); give one")


# --- loading and sampling ---


# A prompt is cut to the model's context anyway; past this it is a mistake (/dev/zero), not a prompt.
LONG_PROMPT = " (the model sees only its context's last tokens)"


def read_prompt(cfg: SampleConfig, stdin: TextIO) -> str:
    if cfg.prompt_file:
        text = read_text_file(Path(cfg.prompt_file), "prompt_file", "prompt", LONG_PROMPT)
    elif cfg.prompt == "-":
        data = stdin.buffer.read(MAX_TEXT_BYTES + 1) if hasattr(stdin, "buffer") else stdin.read().encode()
        text = decode_text(data, "the prompt on stdin", "prompt", LONG_PROMPT)
        # As typed, its last newline too (printf or echo -n pipe a prompt without one); a Windows line end is a
        # newline, as Python's text mode reads it, not a "\r" a char model has never seen
        text = text.replace("\r\n", "\n")
    else:
        text = cfg.prompt
    if not text:
        raise ValueError("the prompt is empty; give PROMPT, --prompt-file FILE, or text on stdin with -")
    return text


def sample(cfg: SampleConfig, out: TextIO | None = None, stdin: TextIO | None = None) -> list[str]:
    """Load the checkpoint, then write cfg.num_samples continuations of the prompt to `out` (stdout)."""
    cfg.validate()
    text = read_prompt(cfg, stdin or sys.stdin)
    return Sampler(cfg).sample(text, cfg, out or sys.stdout)


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as e:  # a bad command line: 2, as argparse's own errors (--top-k 1.5) are
        exit_with_error(e, 2)
    if sys.stdout is None:  # started with stdout closed (`>&-`): Python gives no stream to write to
        exit_with_error(OSError("stdout is closed; there is nowhere to write the sample"), 1)
    replace_unencodable(sys.stdout)
    if note := prompt_slot_note(sys.argv[1:] if argv is None else argv, cfg):
        print(note, file=sys.stderr, flush=True)
    if cfg.verbose:
        print(f"threads: {training.threads.summary()}", file=sys.stderr, flush=True)
    try:
        if cfg.interactive:
            repl(Sampler(cfg), cfg, sys.stdin, sys.stdout, sys.stderr)
        else:
            sample(cfg)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        sys.exit(0)
    except (ValueError, OSError) as e:  # FileNotFoundError is an OSError
        exit_with_error(e, 1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
