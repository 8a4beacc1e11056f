"""How torch's CPU threads wait and how many there are, chosen for the machine the process finds. Every entry
point imports this module before torch, because OpenMP reads its wait policy once, when torch starts its pool.

The wait. OpenMP threads that reach a barrier spin before they sleep: libgomp (the runtime torch's Linux wheels
link) spins GOMP_SPINCOUNT=300,000 times by default, milliseconds. A small model meets thousands of barriers a
step; while the thread it waits for has lost its core to someone else's work, the spin burns the core that thread
could have had (322 tokens/s beside other work against 3,824 with OMP_WAIT_POLICY=PASSIVE, a 2-core Zen 4). Never
spinning costs the quiet case instead: each barrier waits for a futex wake-up (-43% alone). A bounded spin,
BOUNDED_SPIN iterations (a few hundred microseconds), covers a quiet barrier's wait and gives the core up soon
when the thread waited for is not running. Intel's OpenMP (libiomp, some builds) takes KMP_BLOCKTIME in ms.

The count. torch's default (one thread per core of the affinity mask), lowered to a container's CPU quota
(cgroup cpu.max), which torch does not read. It is not lowered for the load found: the scheduler shares the cores
per thread, so fewer threads beside busy neighbours get a smaller share (one thread: 2,520 tokens/s against two
threads' 3,824 at load 6, same machine), and with a bounded spin the extra threads cost little.

The user's settings win: OMP_NUM_THREADS, OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME, a tool's --threads, and
ATTNLAB_THREAD_POLICY=off, which leaves torch's defaults (what bench/bench_train.py --beside compares against).
Variables this module set are listed in ATTNLAB_THREADS_SET, so a child process (a sweep's job, a benchmark's
worker) tells them from the user's and chooses again. Nothing here imports torch.
"""

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

BOUNDED_SPIN = 10_000  # libgomp spins (a pause each); libgomp's own default is 300,000
BOUNDED_BLOCKTIME_MS = 1  # libiomp's smallest wait short of never spinning; its default is 200 ms
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
OURS = (
    "ATTNLAB_THREADS_SET"  # "NAME=value,NAME=value": what this module set (a child's inherited copy is not the user's)
)
OFF = "ATTNLAB_THREAD_POLICY"  # "off": torch's defaults, untouched
SHARED = "ATTNLAB_THREADS_SHARED"  # "N:why": a launcher's count for a process that shares the cores with others


def user_set(name: str, environ: dict[str, str]) -> str | None:
    """The value of `name` if the user (or a launcher) set it, None if unset or set by this module."""
    value = environ.get(name)
    return None if value is None or set_here(environ).get(name) == value else value


def set_here(environ: dict[str, str]) -> dict[str, str]:
    """The variables this module set, as ATTNLAB_THREADS_SET lists them."""
    return dict(pair.split("=", 1) for pair in environ.get(OURS, "").split(",") if "=" in pair)


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on: its affinity mask, lowered to the cgroup's CPU quota (a container's)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity masks
        cores = os.cpu_count() or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def openmp_runtime() -> str:
    """'iomp' where torch ships Intel's OpenMP, else 'gomp' (found on disk: torch must not be imported yet)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec and spec.origin and any((Path(spec.origin).parent / "lib").glob("libiomp5*")):
        return "iomp"
    return "gomp"


@dataclass(frozen=True)
class ThreadPolicy:
    """What this process chose; the run's header prints it (str)."""

    threads: int | None  # None: torch's default count
    threads_why: str  # "the 2 cores", "OMP_NUM_THREADS=3 (yours)"
    wait: str  # "waits spin 10000 then sleep", "OMP_WAIT_POLICY=PASSIVE (yours)"
    env: dict[str, str]  # the variables this policy sets

    def __str__(self) -> str:
        return f"threads {self.threads_why}, {self.wait}"


def choose(environ: dict[str, str], cores: int, runtime: str = "gomp") -> ThreadPolicy:
    """The policy for a process whose environment is `environ`, on `cores` usable CPUs; pure."""
    if environ.get(OFF) == "off":
        return ThreadPolicy(None, "torch's default", f"torch's OpenMP defaults ({OFF}=off)", {})
    env: dict[str, str] = {}
    mine = {name: v for name in WAIT_VARS if (v := user_set(name, environ)) is not None}
    if mine:
        wait = ", ".join(f"{name}={v}" for name, v in mine.items()) + " (yours)"
    elif runtime == "iomp":
        env["KMP_BLOCKTIME"] = str(BOUNDED_BLOCKTIME_MS)
        wait = f"waits spin {BOUNDED_BLOCKTIME_MS} ms then sleep"
    else:
        env["GOMP_SPINCOUNT"] = str(BOUNDED_SPIN)
        wait = f"waits spin {BOUNDED_SPIN} then sleep"
    if (count := user_set("OMP_NUM_THREADS", environ)) is not None:
        return ThreadPolicy(None, f"OMP_NUM_THREADS={count} (yours)", wait, env)
    if SHARED in environ:  # a launcher's share of the cores (a sweep's job)
        shared, why = environ[SHARED].split(":", 1)
        env["OMP_NUM_THREADS"] = shared
        return ThreadPolicy(int(shared), f"{shared} ({why})", wait, env)
    if cores < (os.cpu_count() or cores):  # a quota or mask torch's default would not see
        env["OMP_NUM_THREADS"] = str(cores)
        return ThreadPolicy(cores, f"{cores} (the cores this process may use)", wait, env)
    return ThreadPolicy(None, f"torch's default ({cores} cores)", wait, env)


def apply(environ: dict[str, str] | None = None) -> ThreadPolicy:
    """Choose, and set the variables in `environ` (os.environ) before torch reads them."""
    environ = os.environ if environ is None else environ
    policy = choose(dict(environ), usable_cores(), openmp_runtime())
    environ.update(policy.env)
    if policy.env:
        environ[OURS] = ",".join(f"{k}={v}" for k, v in policy.env.items())
    return policy


def without_policy(environ: dict[str, str]) -> dict[str, str]:
    """`environ` less the variables this module set: a child process given it chooses afresh."""
    ours = set_here(environ)
    return {k: v for k, v in environ.items() if k != OURS and ours.get(k) != v}


def sharing(environ: dict[str, str], count: int | None, at_once: int) -> dict[str, str]:
    """The environment of one of `at_once` processes a launcher runs together (a sweep's jobs): this process's
    choice taken out, so each chooses afresh, with `count` threads (the user's) or else its share of the cores,
    one each where they share them. A user's OMP_NUM_THREADS stays and wins in the child, as everywhere."""
    env = without_policy(environ)
    env.pop(SHARED, None)
    if count is not None:
        env["OMP_NUM_THREADS"] = str(count)  # the user's setting (hydra.launcher.threads): theirs in the child
    elif user_set("OMP_NUM_THREADS", environ) is None:
        cores = usable_cores()
        env[SHARED] = f"{max(1, cores // at_once)}:a share of {cores} cores, {at_once} jobs at once"
    return env


class CpuLoad:
    """CPU time other processes took since it was made: (busy jiffies of the machine - this process's) / wall."""

    def __init__(self, stat: Path = Path("/proc/stat")) -> None:
        self.stat = stat
        self.start = self.sample()

    def sample(self) -> tuple[float, float, float] | None:
        try:
            fields = [int(x) for x in self.stat.read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None  # no /proc (macOS): the load is unknown
        tick = os.sysconf("SC_CLK_TCK")
        busy = (sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)) / tick  # all but idle and iowait
        own = sum(os.times()[:4])  # this process and its waited-for children
        return time.monotonic(), busy, own

    def others_busy(self) -> float | None:
        """Cores the rest of the machine kept busy since the start, on average; None where unknown or too soon."""
        end = self.sample()
        if self.start is None or end is None or end[0] - self.start[0] < 0.05:
            return None
        wall = end[0] - self.start[0]
        return max(0.0, (end[1] - self.start[1]) - (end[2] - self.start[2])) / wall


POLICY = apply()
STARTUP_LOAD = CpuLoad()  # read again at the header: the neighbours' load over this process's start-up


def summary() -> str:
    """The header's field: the policy and the load found while the process started."""
    busy = STARTUP_LOAD.others_busy()
    load = f", other work on {busy:.1f} of {usable_cores()} cores at start" if busy is not None else ""
    return f"{POLICY}{load}"
