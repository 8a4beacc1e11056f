"""Helpers the tests share: the generated corpus, Hydra composition of the real configs, running a
CLI as a user would, and hand counts to check the model against. Fixtures live in conftest.py."""

import random
import subprocess
import sys
from pathlib import Path

from cli.config import compose_configs

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "configs")
WORDS = "the king queen lord speak love death night day sweet fair good my thy thou art is not what".split()


def failing_reads(monkeypatch, error: OSError, under: Path | None = None) -> None:
    """Every read through data.text_file (of a file under `under`, or any) raises `error` (EIO, EACCES): as root,
    a permission cannot be denied for real."""
    from data import text_file

    real = text_file.open_regular

    class Failing:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            if name in ("read", "readline"):
                raise error
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def open_regular(path: Path, what: str = ""):
        f = real(path, what)
        return Failing(f) if under is None or Path(path).is_relative_to(under) else f

    monkeypatch.setattr(text_file, "open_regular", open_regular)


def write_corpus(directory: Path, documents: int = 6, lines: int = 150, seed: int = 0) -> list[str]:
    """Plain-text documents of random lines over a small vocabulary, one file each."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(documents):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(lines))
        path = directory / f"doc{i}.txt"
        path.write_text(text + "\n", encoding="utf-8")
        paths.append(str(path))
    return paths


def readme_sample_run() -> Path:
    """The run directory of the README's sample of a run's output (its `run directory outputs/...` line)."""
    readme = (ROOT / "README.md").read_text().splitlines()
    (directory,) = {line.split()[2] for line in readme if line.startswith("run directory outputs/")}
    return Path(directory)


def compose_config(overrides: list[str]):
    """The real configs/ tree composed through Hydra's compose API, as train.py would see it."""
    return compose_configs(overrides)


def run_train(overrides: list[str]) -> dict:
    """`python train.py OVERRIDES` in this process: the real configs composed, validated, a study's budget
    turned into max_steps, then train()."""
    from cli.config import to_train_config
    from studies.fairness import resolve_budget
    from training.setup import train

    cfg = to_train_config(compose_config(overrides))
    resolve_budget(cfg)
    return train(cfg)


def run_cli(args: list[str], cwd: Path | None = None, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository root (or cwd), as a user's shell would run it; output captured."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout, **kwargs
    )


def hand_count(V, T, L, H, dk, D, F, bias, H_kv=None, qk_norm=False, learned_positions=True):
    H_kv = H_kv or H
    qkv = (H + 2 * H_kv) * dk  # W_Q has H heads, W_K and W_V have H_kv each
    per_layer = D * qkv + H * dk * D + D * F + F * D  # weights
    per_layer += 2 * D * 2 if bias else 2 * D  # two LayerNorms (gain [+ bias])
    if bias:
        per_layer += qkv + D + F + D
    if qk_norm:
        per_layer += 2 * dk  # an RMSNorm gain over d_k for Q and one for K
    positions = T * D if learned_positions else 0  # sinusoidal and RoPE have no parameters
    return V * D + positions + L * per_layer + (2 * D if bias else D)  # + final LayerNorm


def tiny_config(tmp_path: Path, *overrides: str):
    """The real configs composed for a seconds-long run on a generated corpus under tmp_path, validated."""
    from cli.config import to_train_config

    files = write_corpus(tmp_path / "corpus")
    return to_train_config(
        compose_config(
            [
                "+debug=tiny",
                "data.source=files",
                "data.tokenizer=char",
                f"data.files=[{','.join(files)}]",
                f"data.cache_dir={tmp_path / 'cache'}",
                f"out_dir={tmp_path / 'run'}",
                "progress=false",
                *overrides,
            ]
        )
    )


def tiny_trainer(tmp_path: Path, *overrides: str):
    """A Trainer on the CPU over tiny_config's data, ready to step (no run directory)."""
    import torch

    from data.prepare import prepare
    from training.trainer import Trainer

    cfg = tiny_config(tmp_path, *overrides)
    data = prepare(cfg.data, progress=False)
    return Trainer(cfg, data, torch.device("cpu"))


def write_fake_run(directory: Path, config: dict, loss: float | None, params: int = 1000, **info) -> Path:
    """A run directory as the trainer leaves it (run_info, metrics, summary), without training: `config`
    is the nested resolved config (its "seed" is the run's seed); loss None = crashed after one eval."""
    import json

    directory.mkdir(parents=True)
    model = config.get("model", {})
    record = {"n_head": model.get("n_head", 2), "d_k": model.get("d_k", 8), "d_model": 32, "n_layer": 2,
              "params": params, "flops_per_token": 6000, "seed": config.get("seed"), "fairness": "fixed_d_model",
              "config": config, **info}  # fmt: skip
    (directory / "run_info.json").write_text(json.dumps(record))
    (directory / "metrics.jsonl").write_text(json.dumps({"step": 10, "val/loss": 3.0}) + "\n")
    if loss is not None:
        summary = {"status": "completed", "step": 20, "tokens_per_s": 100.0, "val/loss": loss, "val/bpb": loss / 2}
        (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def rewrite_checkpoint(source: Path, target: Path, meta=None, tensors=None) -> Path:
    """A copy of checkpoint `source` at `target` with its header (`meta(header)`) and tensors (`tensors(dict)`)
    changed in place, its sha256 recomputed: a crafted file, whole as far as its digest can tell."""
    import json

    import safetensors
    import safetensors.torch

    from rundir.checkpoint import digest

    with safetensors.safe_open(str(source), framework="pt") as f:
        header, held = json.loads(f.metadata()["attnlab"]), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    if meta is not None:
        meta(header)
    if tensors is not None:
        tensors(held)
    text = json.dumps(header)
    safetensors.torch.save_file(held, str(target), metadata={"attnlab": text, "attnlab_sha256": digest(text, held)})
    return target
