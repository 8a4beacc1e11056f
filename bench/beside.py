"""bench_train.py --beside: training speed beside K CPU-bound competitors this benchmark starts (and stops), as a
fraction of the fair share, and the thread policy's cost on a quiet machine, in interleaved pairs.

    fair share = quiet tokens/s x cores / (cores + K)

the speed a run would keep if the scheduler gave each of the cores + K busy threads the same time (its own threads
are as many as the cores). Each policy trains in a process of its own, started once (OpenMP reads its wait policy
when torch starts its pool) and then measured on request: "attnlab" chooses as every entry point does
(training/threads.py), "torch" leaves torch's OpenMP defaults (ATTNLAB_THREAD_POLICY=off, libgomp's long spin).
The two alternate, pair after pair, the order swapped each pair, so a drift of the machine falls on both; the
quiet pairs come first, then the same pairs beside each K.
"""

if __name__ == "__main__":  # a module: run as a file, its first import of its own package would fail
    raise SystemExit("error: bench/beside.py is a module of bench/bench_train.py; run bench_train.py --beside K")

import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from training import threads

# A competitor: pure Python arithmetic on one core until it is stopped, or until the benchmark that started it
# is gone (its parent changes), so a benchmark killed with SIGKILL leaves nothing running for long.
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(100_000))\n"
POLICIES = ("attnlab", "torch")
LEVEL = 0.9  # the median's interval covers at least this


@contextlib.contextmanager
def competitors(k: int) -> Iterator[list[subprocess.Popen]]:
    """K CPU-bound processes for the length of the block, stopped however it ends (an error, Ctrl-C). Each is in
    a process group of its own: a terminal's Ctrl-C reaches this process alone, whose `finally` stops them."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(k):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL, process_group=0))
        time.sleep(0.5)  # each on a core before the timing starts
        yield procs
    finally:
        stop(procs)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def policy_env(policy: str, environ: dict[str, str], spin: int | None = None) -> dict[str, str]:
    """The environment a worker measuring `policy` starts with: this process's choice taken out, so it chooses
    afresh ("attnlab", with GOMP_SPINCOUNT=spin where given, as a user's setting) or leaves torch's ("torch")."""
    env = threads.without_policy(environ)
    if policy == "torch":
        env[threads.OFF] = "off"
    elif spin is not None:
        env["GOMP_SPINCOUNT"] = str(spin)
    return env


class Worker:
    """One policy's training process: `command` builds its model, warms up and prints "ready"; then each line it
    is sent times its steps and prints {"tokens_per_s": ...}. It ends at the end of its stdin, so it never
    outlives this process; its stderr goes to a file, read back when it fails."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed by close(), after the worker ends)
        self.proc = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            process_group=0,  # Ctrl-C reaches the benchmark alone; it closes the worker's stdin
        )  # fmt: skip

    def reply(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            raise RuntimeError(f"a benchmark worker failed (exit {self.proc.returncode}):\n{self.log.read()[-1500:]}")
        return line.strip()

    def measure(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("measure\n")
        self.proc.stdin.flush()
        return float(json.loads(self.reply())["tokens_per_s"])

    def close(self) -> None:
        """Stopped at once, mid-measurement too (Ctrl-C): it holds nothing worth finishing."""
        with contextlib.suppress(OSError):  # BrokenPipeError: it has ended already
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        stop([self.proc])
        self.log.close()


@contextlib.contextmanager
def workers(command: list[str], envs: dict[str, dict[str, str]]) -> Iterator[dict[str, Worker]]:
    """A Worker per policy, started together and each ready (built, warmed up) before the block; closed after."""
    started: dict[str, Worker] = {}
    try:
        for policy, env in envs.items():
            started[policy] = Worker(command, env)
        for worker in started.values():
            if (said := worker.reply()) != "ready":
                raise RuntimeError(f"a benchmark worker said {said!r} before it was ready")
        yield started
    finally:
        for worker in started.values():
            worker.close()


def serve(step: Callable[[int], None], tokens_per_step: int, warmup: int, steps: int) -> None:
    """The worker's side: warm up, say "ready", then for each line on stdin time `steps` steps (after one untimed
    step, the first after an idle wait) and print their median tokens/s."""
    i = 0
    for i in range(warmup):
        step(i)
    print("ready", flush=True)
    for _ in sys.stdin:
        i += 1
        step(i)
        times = []
        for _ in range(steps):
            i += 1
            start = time.perf_counter()
            step(i)
            times.append(time.perf_counter() - start)
        print(json.dumps({"tokens_per_s": tokens_per_step / statistics.median(times)}), flush=True)


def fair_share(quiet_tokens_per_s: float, cores: int, k: int) -> float:
    return quiet_tokens_per_s * cores / (cores + k)


def median_interval(values: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """The median and a distribution-free interval for it: the order statistics x_(j), x_(n+1-j) with the
    largest j whose coverage, 1 - 2 P(Binomial(n, 1/2) < j), is at least `level` (the widest, min-max, where
    none is); the coverage. No assumption on the spread's shape: one stalled pair moves it by one rank."""
    xs, n = sorted(values), len(values)
    below = 0.5**n  # P(B < j) for j = 1
    j, coverage = 1, 1 - 2 * below
    for cand in range(2, n // 2 + 1):
        below += math.comb(n, cand - 1) * 0.5**n
        if 1 - 2 * below < level:
            break
        j, coverage = cand, 1 - 2 * below
    return xs[j - 1], xs[n - j], coverage


def pairs(measure: Callable[[str], float], n: int) -> dict[str, list[float]]:
    """tokens/s of each policy, n times, in pairs whose order alternates (attnlab first, then torch first...)."""
    speeds: dict[str, list[float]] = {p: [] for p in POLICIES}
    for i in range(n):
        for policy in POLICIES if i % 2 == 0 else POLICIES[::-1]:
            speeds[policy].append(measure(policy))
    return speeds


def spread(values: list[float], fmt: str = ",.0f") -> str:
    return f"median {statistics.median(values):{fmt}} (range {min(values):{fmt}}-{max(values):{fmt}})"


def with_interval(values: list[float], fmt: str = ".3f") -> str:
    low, high, coverage = median_interval(values)
    return f"median {statistics.median(values):{fmt}}, {coverage:.0%} interval {low:{fmt}}-{high:{fmt}}"


def report(measure: Callable[[str], float], besides: list[int], n: int, cores: int) -> dict:
    """Measure and print the quiet pairs, then each policy beside each K; returns the figures."""
    print(f"\nalone: {n} interleaved pairs, attnlab's thread policy against torch's defaults", flush=True)
    quiet = pairs(measure, n)
    for policy in POLICIES:
        print(f"  {policy:<8} tokens/s {spread(quiet[policy])}")
    ratios = [a / t for a, t in zip(quiet["attnlab"], quiet["torch"], strict=True)]
    print(f"  attnlab / torch, pair by pair: {with_interval(ratios)}  (target: >= 0.98, at most 2% slower)", flush=True)
    result: dict = {"cores": cores, "quiet": quiet, "quiet_ratio": statistics.median(ratios), "beside": {}}
    for k in besides:
        print(f"\nbeside {k} CPU-bound competitor{'s' if k > 1 else ''} ({cores} cores: fair share = alone x "
              f"{cores}/{cores + k})", flush=True)  # fmt: skip
        with competitors(k):
            busy = pairs(measure, n)
        shares = {}
        for policy in POLICIES:
            fair = fair_share(statistics.median(quiet[policy]), cores, k)
            shares[policy] = [s / fair for s in busy[policy]]
            print(f"  {policy:<8} tokens/s {spread(busy[policy])}, of its fair share {with_interval(shares[policy])}"
                  + ("  (target: >= 0.80)" if policy == "attnlab" else ""), flush=True)  # fmt: skip
        result["beside"][k] = {"tokens_per_s": busy, "fair_share": {p: statistics.median(s) for p, s in shares.items()}}
    return result


def cpu_model() -> str:
    """lscpu's model name, else /proc/cpuinfo's."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, env={**os.environ, "LC_ALL": "C"})
        for line in out.stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"
