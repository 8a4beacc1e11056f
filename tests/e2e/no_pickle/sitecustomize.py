"""Put on PYTHONPATH by tests/e2e/test_distributed.py's torchrun and test_parallel_sweep.py's sweeps: in each
training process torchrun starts (never in torchrun itself, whose rendezvous pickles) and in each sweep job the
parallel launcher starts, every unpickling fails, so a process that loads what another sent through pickle fails
the test."""

import os
import pickle

if ("LOCAL_RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ) or "ATTNLAB_SWEEP_JOB" in os.environ:

    class NoUnpickling(pickle.Unpickler):
        def load(self) -> object:
            raise AssertionError("a training process unpickled data")

    def no_loads(*args: object, **kwargs: object) -> object:
        raise AssertionError("a training process unpickled data")

    pickle.Unpickler, pickle.loads = NoUnpickling, no_loads
