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


def test_an_offline_wandb_run_prints_one_line_saying_where_its_files_are(tmp_path, capfd, caplog):
    # Defect: wandb's banner, "Run history" sparklines and sync hints were 30 of the 78 lines a default
    # run printed, pushing the closing lines (where the run is, the next commands) off the screen.
    from rundir.records import LoggerConfig, MetricsLogger, start_wandb

    with caplog.at_level(logging.INFO, logger="rundir.records"):
        logger = MetricsLogger(tmp_path, start_wandb(tmp_path, LoggerConfig(mode="offline"), {"seed": 1}))
        logger.log({"train/loss": 1.0}, step=1)
        logger.close()
    out, err = capfd.readouterr()
    assert "wandb:" not in out + err, out + err
    [line] = [r.getMessage() for r in caplog.records if r.name == "rundir.records"]
    folder = next((tmp_path / "wandb").glob("offline-run-*"))
    assert line == f"wandb: offline run in {folder} (upload it with: wandb sync {folder})"


def test_a_wandb_mode_wandb_does_not_know_is_one_line_naming_it(tmp_path, monkeypatch):
    # Defect: WANDB_MODE=bogus was "error: 1 validation error for Settings", naming neither the variable nor a mode
    import pytest

    from rundir.records import LoggerConfig, start_wandb

    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(ValueError, match=r"^WANDB_MODE='bogus' is unknown to wandb; use one of: online, offline"):
        start_wandb(tmp_path, LoggerConfig(mode="auto"), {})
    assert list(tmp_path.iterdir()) == []


def test_a_train_log_that_cannot_be_written_is_one_warning_line_not_a_traceback_per_record(tmp_path, capsys):
    # Defect: on a full disk logging printed '--- Logging error ---' and a traceback for every record
    from rundir.records import RunLogHandler

    handler = RunLogHandler(tmp_path / "train.log")
    for n in range(3):
        try:
            raise OSError(28, "No space left on device")  # what the handler's write raised
        except OSError:
            handler.handleError(logging.makeLogRecord({"msg": f"line {n}"}))  # as logging calls it there
    handler.close()
    err = capsys.readouterr().err
    assert err == f"warning: {tmp_path / 'train.log'} cannot be written (No space left on device); it stops here\n"
