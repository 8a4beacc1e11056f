"""The run's own log file: train.log holds this run's lines and no other run's."""

import logging

from rundir.records import log_to_file


def test_each_job_of_a_sweep_logs_into_its_own_train_log_only(tmp_path):
    # Defect: a sweep runs its jobs in one process, and every job added a root handler for its train.log
    # that stayed: job 0's train.log got every later job's lines, and their errors, which the ablation
    # report then read as job 0's own.
    log = logging.getLogger("sweep-test")
    log.setLevel(logging.INFO)
    try:
        for job in range(3):
            (tmp_path / str(job)).mkdir()
            log_to_file(tmp_path / str(job) / "train.log")
            log.error("job %d failed", job)
        for job in range(3):
            lines = (tmp_path / str(job) / "train.log").read_text().splitlines()
            assert [line.split(" - ", 1)[1] for line in lines] == [f"job {job} failed"]
    finally:
        for handler in logging.getLogger().handlers[:]:
            if isinstance(handler, logging.FileHandler) and str(tmp_path) in handler.baseFilename:
                logging.getLogger().removeHandler(handler)
                handler.close()
