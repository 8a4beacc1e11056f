"""The interactive mode of scripts/sample.py (`-i`): load the model once, then sample prompt after
prompt from stdin, with `:name value` commands changing the sampling settings while it runs.

It reads plain lines from stdin, so a test (or a pipe) can drive it: `printf 'ROMEO:\n:seed 2\n' |
python scripts/sample.py RUN -i`. Lines that arrive while a sample is being written wait in the pipe's
or the terminal's buffer and are read in turn (Ctrl-C is the exception: a terminal drops the typed-ahead
input with it). Each prompt starts a fresh generator from the current seed, so a prompt gives exactly
what the one-shot command with the same settings prints; on a terminal the sample streams as it is made.
"""

if __name__ == "__main__":  # a module: run as a file, its first import of its own package would fail
    raise SystemExit("error: scripts/sample_repl.py is a module; its REPL runs as: python scripts/sample.py RUN -i")

import dataclasses
import difflib
from typing import TextIO

from cli.schema_help import show_default
from scripts.sampler import (
    CLI_SAMPLING_FIELDS,
    SampleConfig,
    SampleInterrupted,
    Sampler,
    bool_word,
    cli_fields,
    is_switch,
    value_parser,
)

REPL_ALIASES = {"max": "max_new_tokens", "temp": "temperature", "k": "top_k", "p": "top_p", "n": "num_samples"}
REPL_SETTINGS = ("num_samples", "stream", "stop_at_eot")  # SampleConfig fields the REPL may change
REPL_HELP = """Type a prompt and press Enter to sample it; "\\n" in a prompt is a newline, "::text" a prompt that
starts with ":". Commands:
  :temperature X   :top_k N|none   :top_p X|none   :seed N|none   :max N (max_new_tokens)
  :context_length N|none   :use_cache on|off   :pointer on|off   :num_samples N   :stream on|off
  :stop_at_eot on|off
  :show   the settings       :help   this text       :quit   leave (end of input does too)
Ctrl-C stops the sample being written; at the prompt it leaves."""


def repl(sampler: Sampler, cfg: SampleConfig, stdin: TextIO, out: TextIO, err: TextIO) -> SampleConfig:
    """Sample each line of stdin as a prompt, with `:name value` commands changing the settings;
    a bad prompt or setting prints `error: ...` and the loop goes on. Returns the final settings."""
    tty = stdin.isatty()
    if tty:
        err.write(f"loaded {sampler.path}; :help lists the commands, :quit leaves\n")
    while True:
        if tty:
            err.write("> ")
            err.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:  # Ctrl-C at the prompt leaves, on a line of its own (the shell's prompt was glued on)
            if tty:
                err.write("\n")
            raise
        if not line:  # Ctrl-D, or the end of piped input
            if tty:
                err.write("\n")
            return cfg
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            if line.startswith(":") and not line.startswith("::"):
                name, value = [*line[1:].split(None, 1), "", ""][:2]  # any whitespace: ':temp<TAB>0' was unknown
                if name in ("q", "quit", "exit"):
                    return cfg
                name = REPL_ALIASES.get(name, name)
                changed = repl_command(name, value.strip(), cfg, out)
                sampler.params(changed)  # refused now, not at every later prompt (a context_length past block_size)
                cfg = changed
                if note := acknowledgement(name, cfg):  # on stderr: stdout holds the samples and what was asked for
                    err.write(note + "\n")
            else:
                text = line[1:] if line.startswith("::") else line
                sampler.sample(text.replace("\\n", "\n"), cfg, out)
        except ValueError as e:
            err.write(f"error: {e}\n")
        except KeyboardInterrupt as e:  # Ctrl-C stops this sample; the loaded model stays for the next prompt
            if not isinstance(e, SampleInterrupted):  # which ended its own line
                out.write("\n")
                out.flush()
            err.write("interrupted; the next prompt samples again (:quit or end of input leaves)\n")


def settings(cfg: SampleConfig) -> dict[str, object]:
    """Every setting the REPL shows and changes, by name."""
    return {
        **{k: getattr(cfg.sampling, k) for k in CLI_SAMPLING_FIELDS},
        **{k: getattr(cfg, k) for k in REPL_SETTINGS},
    }


def acknowledgement(name: str, cfg: SampleConfig) -> str:
    """The line that says what a command set, from the settings it leaves (so a value shows as parsed: 0 as 0.0);
    "" for :help and :show, whose answer is the acknowledgement."""
    if name in ("help", "show"):
        return ""
    value = settings(cfg)[name]
    greedy = " (greedy: the most likely token at each step)" if name == "temperature" and value == 0 else ""
    return f"set {name}={show_default(value)}{greedy}"


def repl_command(name: str, value: str, cfg: SampleConfig, out: TextIO) -> SampleConfig:
    """Apply one `:name value` command; ValueError (one line) for a bad name or value."""
    if name == "help":
        out.write(REPL_HELP + "\n")
        return cfg
    if name == "show":
        out.write("  ".join(f"{k}={show_default(v)}" for k, v in settings(cfg).items()) + "\n")
        return cfg
    docs = {d.name: d for d in cli_fields()}
    if name not in CLI_SAMPLING_FIELDS and name not in REPL_SETTINGS:
        hint = difflib.get_close_matches(name, [*CLI_SAMPLING_FIELDS, *REPL_SETTINGS, "show", "help", "quit"], n=1)
        raise ValueError(f"unknown command :{name}{f' (did you mean :{hint[0]}?)' if hint else ''}; :help lists them")
    doc = docs[name]
    try:
        parsed = bool_word(name, value) if is_switch(doc) else value_parser(doc)(value)
    except (TypeError, ValueError) as e:
        if str(e).startswith(f"{name}="):
            raise
        kind = {"int": "an integer", "float": "a number", "str": "text"}[doc.type.replace(" | None", "")]
        raise ValueError(f"{name}={value!r} is invalid; it must be {kind}{' or none' * ('None' in doc.type)}") from None
    if name in REPL_SETTINGS:
        changed = dataclasses.replace(cfg, **{name: parsed})
        changed.validate()
        return changed
    return dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, **{name: parsed}))
