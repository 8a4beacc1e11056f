"""The thread policy (training/threads.py): what it chooses, that the user's settings win, that a sweep's jobs get
their share of the cores, and that every entry point has chosen before torch is first imported (OpenMP reads its
wait policy once, when torch starts its pool)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training import threads
from training.threads import BOUNDED_SPIN, OFF, OURS, SHARED, choose, sharing, without_policy

ROOT = Path(__file__).resolve().parents[2]
MODULES_NOT_RUN = ("bench/beside.py", "bench/classical.py")  # imported by the benchmarks, never run themselves
ENTRY_POINTS = [
    "train.py",
    "scripts/sample.py",
    "scripts/lab.py",
    "cli/sweep_job.py",  # a sweep's job: `python -m cli.sweep_job train.py ARGS`
    *sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "bench").glob("*.py")
        if str(p.relative_to(ROOT)) not in MODULES_NOT_RUN
    ),
]
WATCHED = ("GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", OURS)

# Imports each entry point as a module (its main() not run) in one process, and stops it at its first import of
# torch, wherever that comes from, recording the environment OpenMP would read at that moment.
AT_TORCH = """
import importlib.util, json, os, sys
from importlib.machinery import PathFinder
class TorchImported(BaseException):  # not an ImportError: no `except ImportError` on the way may swallow it
    pass
class Stop:  # torch's loader: found as ever (find_spec looks without importing), stopped when it would run
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise TorchImported({k: os.environ.get(k) for k in WATCHED})
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        spec = PathFinder.find_spec(name, path)
        spec.loader = Stop()
        return spec
sys.meta_path.insert(0, Watch())
environ, modules, path, seen = dict(os.environ), set(sys.modules), list(sys.path), {}
for entry in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("entry_point", entry)
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        seen[entry] = "torch never imported"
    except TorchImported as at_torch:
        seen[entry] = at_torch.args[0]
    os.environ.clear()
    os.environ.update(environ)
    for name in set(sys.modules) - modules:  # the repo's modules imported afresh by the next entry, as a new
        file = getattr(sys.modules[name], "__file__", None) or ""  # process would (installed packages stay, a
        if file.startswith(os.getcwd()) and not file.startswith(sys.prefix):  # venv inside the repo's among them)
            del sys.modules[name]
    sys.path[:] = path
print(json.dumps(seen))
"""


def env_at_torch_import(environ: dict[str, str], entries: list[str]) -> dict[str, dict]:
    script = f"WATCHED = {WATCHED!r}\n{AT_TORCH}"
    done = subprocess.run(
        [sys.executable, "-c", script, *entries], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def clean(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with no thread setting of anyone's: what a user's shell without OMP_* gives."""
    env = without_policy(environ)
    for name in (*WATCHED, OFF, SHARED):
        env.pop(name, None)
    return env


def test_every_entry_point_has_chosen_before_torch_is_imported():
    environ = clean(dict(os.environ))
    chosen = choose(environ, threads.usable_cores(), threads.openmp_runtime()).env
    assert chosen  # a bounded spin at least
    seen = env_at_torch_import(environ, ENTRY_POINTS)
    assert sorted(seen) == sorted(ENTRY_POINTS)
    for entry, env in seen.items():
        if env == "torch never imported" and "import torch" not in (ROOT / entry).read_text():
            continue  # no torch at all (bench/bench_prepare.py): nothing to choose before
        assert isinstance(env, dict), f"{entry}: {env}"
        assert {k: env[k] for k in chosen} == chosen, f"{entry} imported torch before the policy: {env}"
        assert env[OURS], entry  # listed, so a child process it starts chooses afresh


def test_the_users_settings_reach_torch_untouched_and_a_sweep_job_gets_its_share():
    environ = clean(dict(os.environ))
    mine = {**environ, "GOMP_SPINCOUNT": "77", "OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3"}
    (env,) = env_at_torch_import(mine, ["train.py"]).values()
    assert (env["GOMP_SPINCOUNT"], env["OMP_WAIT_POLICY"], env["OMP_NUM_THREADS"]) == ("77", "ACTIVE", "3")
    assert env[OURS] is None  # nothing of its own set
    # A sweep's job: the launcher's environment (after its own policy), two jobs at once.
    launcher = {**environ, **choose(environ, threads.usable_cores()).env}
    (job,) = env_at_torch_import(sharing(launcher, None, 2), ["train.py"]).values()
    assert job["OMP_NUM_THREADS"] == str(max(1, threads.usable_cores() // 2))
    assert job["GOMP_SPINCOUNT"] == launcher["GOMP_SPINCOUNT"]  # chosen again in the job, not inherited as the user's


def test_torch_computes_on_the_count_the_policy_chose():
    environ = {**clean(dict(os.environ)), SHARED: "1:a share of 2 cores, 2 jobs at once"}
    probe = (  # train.py run as a module (its main not run), then torch's pool
        "import runpy\nrunpy.run_path('train.py')\nimport torch, training.threads as t\n"
        "print(torch.get_num_threads())\nprint(t.summary())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    count, summary = done.stdout.strip().splitlines()[-2:]
    assert count == "1"
    assert summary.startswith("threads 1 (a share of 2 cores, 2 jobs at once), ")


def test_the_default_is_a_bounded_spin_with_torchs_count_of_threads():
    policy = choose({}, os.cpu_count() or 1, "gomp")
    assert policy.env == {"GOMP_SPINCOUNT": str(BOUNDED_SPIN)}
    assert str(policy) == f"threads torch's default ({os.cpu_count() or 1} cores), waits spin {BOUNDED_SPIN} then sleep"
    assert choose({}, os.cpu_count() or 1, "iomp").env == {"KMP_BLOCKTIME": "1"}


def test_a_cpu_quota_lowers_the_count_and_off_leaves_torchs_defaults():
    if (os.cpu_count() or 1) < 2:
        pytest.skip("a quota below the machine's cores needs two cores")
    assert choose({}, 1).env == {"GOMP_SPINCOUNT": str(BOUNDED_SPIN), "OMP_NUM_THREADS": "1"}
    assert choose({OFF: "off"}, 1).env == {}


@pytest.mark.parametrize(
    "mine,kept",
    [
        ({"OMP_WAIT_POLICY": "PASSIVE"}, "OMP_WAIT_POLICY=PASSIVE (yours)"),
        ({"GOMP_SPINCOUNT": "0"}, "GOMP_SPINCOUNT=0 (yours)"),
        ({"KMP_BLOCKTIME": "5"}, "KMP_BLOCKTIME=5 (yours)"),
    ],
)
def test_the_users_wait_setting_wins(mine, kept):
    policy = choose(mine, 2)
    assert policy.env == {} if (os.cpu_count() or 1) <= 2 else "OMP_NUM_THREADS" in policy.env
    assert policy.wait == kept


def test_a_count_this_module_set_is_chosen_again_in_a_child_but_the_users_is_kept():
    inherited = {
        "OMP_NUM_THREADS": "1",
        "GOMP_SPINCOUNT": str(BOUNDED_SPIN),
        OURS: f"GOMP_SPINCOUNT={BOUNDED_SPIN},OMP_NUM_THREADS=1",
    }
    assert "(yours)" not in str(choose(inherited, 4))
    assert choose({**inherited, "OMP_NUM_THREADS": "3"}, 4).threads_why == "OMP_NUM_THREADS=3 (yours)"
    assert without_policy(inherited) == {}


def test_a_sweep_gives_each_job_its_share_unless_told(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    launcher = {"PATH": "/bin", "GOMP_SPINCOUNT": str(BOUNDED_SPIN), OURS: f"GOMP_SPINCOUNT={BOUNDED_SPIN}"}
    assert sharing(launcher, None, 2) == {"PATH": "/bin", SHARED: "1:a share of 2 cores, 2 jobs at once"}
    assert sharing(launcher, None, 1)[SHARED] == "2:a share of 2 cores, 1 jobs at once"
    assert sharing(launcher, None, 3)[SHARED].startswith("1:")  # never none
    assert sharing(launcher, 2, 2) == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}  # hydra.launcher.threads=2
    assert sharing({**launcher, "OMP_NUM_THREADS": "2"}, None, 2) == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}  # yours
    job = choose(sharing(launcher, None, 2), 2)
    assert (job.threads, job.env["OMP_NUM_THREADS"]) == (1, "1")
    assert str(job).startswith("threads 1 (a share of 2 cores, 2 jobs at once), waits spin")
    assert choose({**sharing(launcher, None, 2), "OMP_NUM_THREADS": "2"}, 2).threads_why == "OMP_NUM_THREADS=2 (yours)"


def test_sample_says_what_was_chosen_on_stderr_with_verbose_and_nothing_without(tmp_path, capsys):
    from scripts import sample
    from tests.unit.test_lab import tiny_checkpoint

    checkpoint = str(tiny_checkpoint(tmp_path / "tiny.safetensors"))
    args = [checkpoint, "ab", "--max-new-tokens", "2", "--device", "cpu", "--seed", "0"]
    sample.main(args)
    assert capsys.readouterr().err == ""
    sample.main([*args, "--verbose"])
    out, err = capsys.readouterr()
    assert out.startswith("ab")
    (line,) = err.splitlines()  # once
    assert line.startswith(f"threads: {threads.POLICY}")  # the count and the wait, then the load found at start


def test_the_lab_says_what_was_chosen_as_it_starts(tmp_path):
    from tests.unit.test_lab import start_lab, tiny_checkpoint

    lab = start_lab(str(tiny_checkpoint(tmp_path / "tiny.safetensors")), "--device", "cpu")
    try:
        assert lab.stdout is not None
        assert lab.stdout.readline().startswith("attnlab lab: ")
        assert lab.stdout.readline().startswith("threads: threads ")
    finally:
        lab.kill()
        lab.wait()
