"""Benchmark data preparation at scale: `data=files` with the learned BPE on a corpus of real text.

    python bench/bench_prepare.py --size 1GB            # the issue's measurement (tens of minutes on 2 cores)
    python bench/bench_prepare.py --size 100MB --interrupt utf8:1 learn:2 tokenize:2
    python bench/bench_prepare.py --size 200KB --dir /tmp/p   # a functional check, seconds

The corpus: the text files on this machine (the Python standard library's sources, /usr/share/doc, the man pages,
gzipped ones unpacked), each one that is UTF-8 without NULs, concatenated and repeated until --size bytes, in
16 files (at most 16 MB each, more files beyond 256 MB), under --dir/corpus-SIZE (built once, reused).

The preparation runs in a child process, on a fresh cache (--dir/cache), as train.py would run it
(data.prepare.prepare). Reported: seconds per phase (the UTF-8 check, splitting, learning the BPE, tokenizing,
the rest), the tokenizing phase's CPU seconds over its wall seconds (the cores it kept busy), peak RSS of the
preparing process and of its BPE learner (resource.getrusage: self and children), the cache's size against its
token files (train.bin + val.bin), and the UTF-8 check of the same unchanged files again (its cached record).

--interrupt PHASE:SECONDS ...: a fresh preparation each, sent SIGINT (as Ctrl-C sends it, to the whole process
group) SECONDS after PHASE starts; reported: the seconds until every process of the group has exited, its exit
status, and what it left in the cache besides the UTF-8 record (nothing half-made: the target).
"""

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python bench/bench_prepare.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.schema_help import OneLineParser, at_least

PHASES = ("utf8", "split", "learn", "tokenize")
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
FILES = 16
MAX_FILE_BYTES = 16 << 20
SOURCE_LIMIT = 256 << 20  # distinct text read from the machine; beyond it the corpus repeats it
ROOT = Path(__file__).resolve().parents[1]


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match[2].upper() if match else ""
    if not match or unit not in {**UNITS, "": 1} or float(match[1]) * UNITS.get(unit, 1) < 1000:
        raise argparse.ArgumentTypeError(
            f"{text!r} is invalid; give a size of at least 1KB, e.g. 200KB, 100MB, 1GB (units {', '.join(UNITS)})"
        )
    return int(float(match[1]) * UNITS.get(unit, 1))


def parse_interrupt(text: str) -> tuple[str, float]:
    phase, _, seconds = text.partition(":")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if phase not in PHASES or not value >= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is invalid; give PHASE:SECONDS with PHASE one of {', '.join(PHASES)} and SECONDS >= 0"
        )
    return phase, value


# -- the corpus ----------------------------------------------------------------------------------------


def text_sources() -> Iterator[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    yield from sorted(stdlib.rglob("*.py"))
    for folder in (Path("/usr/share/doc"), Path("/usr/share/man")):
        if folder.is_dir():
            yield from sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def read_text(path: Path) -> str | None:
    """The file's text (a .gz unpacked) if it is UTF-8 without NULs, else None."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
        return None
    return text if text and "\0" not in text else None


def distinct_texts(limit: int) -> list[str]:
    texts, size = [], 0
    for path in text_sources():
        if (text := read_text(path)) is not None:
            texts.append(text)
            size += len(text.encode("utf-8"))
            if size >= limit:
                break
    if not texts:
        raise ValueError("found no UTF-8 text files on this machine to build a corpus from")
    return texts


def build_corpus(directory: Path, size: int) -> tuple[list[Path], int]:
    """--size bytes of real text in files under `directory` (reused when complete); the files and distinct bytes."""
    done = directory / "done.json"
    if done.is_file():
        record = json.loads(done.read_text())
        return [directory / name for name in record["files"]], record["distinct_bytes"]
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    texts = distinct_texts(min(size, SOURCE_LIMIT))
    distinct = sum(len(t.encode("utf-8")) for t in texts)
    count = max(FILES, -(-size // MAX_FILE_BYTES))
    files, written, n = [], 0, 0
    for i in range(count):
        target = (size * (i + 1)) // count - written  # the files' sizes add up to `size` exactly
        path = directory / f"part{i:04d}.txt"
        with open(path, "wb") as f:
            left = target
            while left > 0:
                data = (texts[n % len(texts)] + "\n").encode("utf-8")
                n += 1
                if len(data) > left:  # cut at a character boundary, then pad with newlines to the exact size
                    data = data[:left].decode("utf-8", errors="ignore").encode("utf-8")
                    data += b"\n" * (left - len(data))
                f.write(data)
                left -= len(data)
        written += target
        files.append(path)
    done.write_text(json.dumps({"files": [p.name for p in files], "distinct_bytes": distinct}))
    return files, distinct


# -- the preparation, in a child -----------------------------------------------------------------------


def event(**fields) -> None:
    print(json.dumps(fields), flush=True)


def timed(phase: str, fn):
    """`fn` with a start and an end event (wall and CPU seconds) around each call."""

    def wrapper(*args, **kwargs):
        event(start=phase)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            event(end=phase, seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu)

    return wrapper


def child(files: list[str], cache_dir: str, vocab: int, progress: bool) -> None:
    """Prepare the corpus as train.py does, each phase timed; a last event with the result and the peak RSS."""
    import importlib
    import logging

    from data.config import DataConfig

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the preparation's lines, as train.py logs them

    prepare, sources = importlib.import_module("data.prepare"), importlib.import_module("data.sources")
    sources.check_utf8_files = timed("utf8", sources.check_utf8_files)
    prepare.split_segments = timed("split", prepare.split_segments)
    prepare.learn_in_child = timed("learn", prepare.learn_in_child)
    prepare.write_splits = timed("tokenize", prepare.write_splits)
    cfg = DataConfig(source="files", files=files, tokenizer="bpe", bpe_vocab_size=vocab, cache_dir=cache_dir)
    start = time.perf_counter()
    try:
        prepared = prepare.prepare(cfg, progress=progress)
    except KeyboardInterrupt:
        event(interrupted=time.monotonic())  # the system-wide clock: the parent compares it with its own
        sys.exit(130)
    meta = prepared.meta
    event(
        total=time.perf_counter() - start,
        directory=str(prepared.directory),
        train_tokens=meta["train_tokens"],
        val_tokens=meta["val_tokens"],
        peak_rss_self=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        peak_rss_children=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    )
    from data.utf8_check import check_utf8_files  # unwrapped: the same check, once more on unchanged files

    start = time.perf_counter()
    check_utf8_files(sources.expand_files(files), Path(cache_dir))
    event(utf8_again=time.perf_counter() - start)


def start_child(files: list[Path], cache_dir: Path, vocab: int, progress: bool) -> subprocess.Popen:
    shutil.rmtree(cache_dir, ignore_errors=True)
    spec = json.dumps({"files": [str(p) for p in files], "cache_dir": str(cache_dir), "vocab": vocab})
    command = [sys.executable, str(Path(__file__).resolve()), "--child", spec, *(["--progress"] if progress else [])]
    # Its own process group, as a terminal's foreground job: SIGINT to the group reaches the learner too.
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)


def events(proc: subprocess.Popen) -> Iterator[dict]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            yield json.loads(line)


def tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def measure(files: list[Path], cache_dir: Path, vocab: int, progress: bool) -> dict:
    proc = start_child(files, cache_dir, vocab, progress)
    phases: dict[str, dict] = {}
    result: dict = {}
    for e in events(proc):
        if "end" in e:
            phases[e["end"]] = e
        elif "total" in e or "utf8_again" in e:
            result.update(e)
    if proc.wait() != 0:
        raise RuntimeError(f"the preparation failed (exit status {proc.returncode})")
    tokens = sum((Path(result["directory"]) / f"{split}.bin").stat().st_size for split in ("train", "val"))
    return {"phases": phases, **result, "token_bytes": tokens, "cache_bytes": tree_bytes(cache_dir)}


def leftovers(cache_dir: Path) -> list[str]:
    """Everything in the cache but its UTF-8 record and the empty folders a preparation starts with."""
    allowed = {"utf8_checked.txt", "prepared"}
    return sorted(
        str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*") if str(p.relative_to(cache_dir)) not in allowed
    )


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def interrupt(files: list[Path], cache_dir: Path, vocab: int, phase: str, seconds: float) -> dict:
    """A fresh preparation sent SIGINT `seconds` after `phase` starts: seconds to exit, status, what it left."""
    proc = start_child(files, cache_dir, vocab, progress=False)
    pgid, sent, stopped = proc.pid, None, None
    for e in events(proc):
        if e.get("start") == phase and sent is None:
            time.sleep(seconds)
            sent = time.monotonic()
            os.killpg(pgid, signal.SIGINT)
        if "interrupted" in e:
            stopped = e["interrupted"] - sent
    proc.wait()
    while group_alive(pgid) and time.monotonic() - (sent or 0) < 60:  # the learner, say, outliving its parent
        time.sleep(0.01)
    exited = time.monotonic() - sent if sent is not None else None
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    left = leftovers(cache_dir)
    return {"exit_s": exited, "stopped_s": stopped, "status": proc.returncode, "left": left}


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("1GB"), help="corpus bytes: 200KB, 100MB, 1GB")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/attnlab-bench-prepare"), help="corpus and cache here")
    parser.add_argument("--vocab", type=at_least(257), default=4096, help="the learned BPE's ids (the default's 4096)")
    parser.add_argument(
        "--interrupt",
        type=parse_interrupt,
        nargs="*",
        default=[],
        help="PHASE:SECONDS ... (utf8, split, learn, tokenize)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars from the preparation")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--progress", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        child(spec["files"], spec["cache_dir"], spec["vocab"], args.progress)
        return

    start = time.perf_counter()
    files, distinct = build_corpus(args.dir / f"corpus-{args.size}", args.size)
    print(
        f"attnlab bench_prepare: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; corpus {mb(args.size)} in "
        f"{len(files)} files ({mb(distinct)} of distinct text from this machine) under {files[0].parent}, "
        f"ready in {time.perf_counter() - start:.1f} s; data=files, learned BPE of {args.vocab} ids\n",
        flush=True,
    )
    r = measure(files, args.dir / "cache", args.vocab, not args.no_progress)
    rest = r["total"] - sum(p["seconds"] for p in r["phases"].values())
    for name in PHASES:
        p = r["phases"].get(name)
        if p is not None:
            busy = f" ({p['cpu_seconds'] / p['seconds']:.2f} cores busy)" if name == "tokenize" and p["seconds"] else ""
            print(f"{name:>10}: {p['seconds']:8.1f} s{busy}")
    print(f"{'rest':>10}: {rest:8.1f} s\n{'total':>10}: {r['total']:8.1f} s ({args.size / r['total'] / 1e6:.2f} MB/s)")
    print(
        f"peak RSS: preparing process {mb(r['peak_rss_self'])}, BPE learner {mb(r['peak_rss_children'])} "
        f"(target: at most 2,000 MB)"
    )
    print(
        f"cache {mb(r['cache_bytes'])} / token files {mb(r['token_bytes'])} = "
        f"{r['cache_bytes'] / r['token_bytes']:.3f}x (target: at most 1.2x)"
    )
    print(f"UTF-8 check again, files unchanged: {r['utf8_again']:.2f} s")
    for phase, seconds in args.interrupt:
        i = interrupt(files, args.dir / f"cache-interrupt-{phase}", args.vocab, phase, seconds)
        if i["exit_s"] is None:
            print(f"SIGINT {seconds:g} s into {phase}: never sent (the phase did not start)")
            continue
        stopped = "it finished first" if i["stopped_s"] is None else f"{i['stopped_s']:.2f} s"
        print(
            f"SIGINT {seconds:g} s into {phase}: preparation stopped after {stopped}, every process gone after "
            f"{i['exit_s']:.2f} s, exit status {i['status']}, left in the cache: {', '.join(i['left']) or 'nothing'} "
            "(target: at most 2 s, nothing)"
        )


if __name__ == "__main__":
    main()
