"""report_to: metrics reach TensorBoard or W&B (offline without network) under TRL's names; bad choices are one-line errors."""

import importlib.util
import json
import time

import pytest

from esopt.confutil import ConfigError
from esopt.train.logging import MetricsLogger, check_report_to

STEP_VALUES = {"train/fitness_mean": 0.25, "es/alpha": 0.01, "train/success": 0.5, "note": "not a number"}


def _scalars(tensorboard_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tensorboard_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_gets_trl_names_and_jsonl_keeps_esopt_names(tmp_path):
    pytest.importorskip("tensorboard")
    logger = MetricsLogger(tmp_path, "tensorboard")
    logger.log(1, STEP_VALUES)
    logger.log(2, {**STEP_VALUES, "train/fitness_mean": 0.75})
    logger.close()
    scalars = _scalars(tmp_path / "tensorboard")
    assert scalars["train/reward"] == [(1, 0.25), (2, 0.75)]
    assert scalars["train/learning_rate"][0][1] == pytest.approx(0.01)
    assert scalars["train/success"] == [(1, 0.5), (2, 0.5)]
    assert "train/fitness_mean" not in scalars
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[1]["train/fitness_mean"] == 0.75 and lines[1]["note"] == "not a number"


def test_none_writes_only_jsonl(tmp_path):
    logger = MetricsLogger(tmp_path, "none")
    logger.log(1, STEP_VALUES)
    logger.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_wandb_logs_offline_when_the_server_cannot_be_reached(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "https://127.0.0.1:9")  # nothing listens there: no network
    logger = MetricsLogger(tmp_path, "wandb", {"es": {"sigma": 0.01}})
    logger.log(1, STEP_VALUES)
    logger.close()
    import wandb

    wandb.teardown()  # stops W&B's service process, which would outlive the test as a stray child
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    record = next(runs[0].glob("*.wandb"))
    for _ in range(120):  # W&B's writer process may still be flushing the record file after finish()
        if b"train/reward" in record.read_bytes():
            break
        time.sleep(0.5)
    data = record.read_bytes()
    assert b"train/reward" in data and b"train/fitness_mean" not in data


def test_bad_or_missing_sink_is_a_one_line_error(monkeypatch):
    with pytest.raises(ConfigError, match="report_to must be one of auto, tensorboard, wandb, none"):
        check_report_to("mlflow")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real_find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"pip install wandb"):
        check_report_to("wandb")
    check_report_to("none")


def test_cli_rejects_a_bad_report_to_before_starting(capsys, tmp_path):
    from esopt.cli import main

    assert main(["train", "--report_to", "mlflow", "--runs_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report_to must be one of" in err[0]
    assert main(["grpo", "--report_to", "mlflow", "--runs_dir", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


def test_es_run_reports_to_tensorboard(tmp_path, tiny_train_config, make_tiny_policy):
    pytest.importorskip("tensorboard")
    from esopt.train.es_trainer import ESTrainer

    config = tiny_train_config(tmp_path, "tb", steps=1, report_to="tensorboard")
    trainer = ESTrainer.start(config, policy=make_tiny_policy())
    trainer.run()
    scalars = _scalars(tmp_path / "tb" / "tensorboard")
    assert [step for step, _ in scalars["train/reward"]] == [1]
    assert {"eval/reward", "eval/success", "es/sigma", "train/learning_rate"} <= set(scalars)
