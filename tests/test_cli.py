"""The CLI turns bad input into one-line errors and wires flags into the config."""

import pytest

from esopt.cli import main


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_unknown_env(capsys, tmp_path):
    assert main(["train", "--env", "chess", "--runs_dir", str(tmp_path)]) == 2
    assert "unknown env 'chess'" in _error_line(capsys)


def test_bad_value(capsys, tmp_path):
    assert main(["train", "--es.population", "lots", "--runs_dir", str(tmp_path)]) == 2
    assert "es.population expects int" in _error_line(capsys)


@pytest.mark.parametrize(
    "flag, value, message",
    [("--model.backend", "tpu", "model.backend must be hf or vllm"), ("--rollout.sampling.top_p", "0", "top_p")],
)
def test_flag_values_are_checked_like_yaml_values(capsys, tmp_path, flag, value, message):
    assert main(["train", flag, value, "--runs_dir", str(tmp_path)]) == 2
    assert message in _error_line(capsys)
    assert not any(tmp_path.iterdir())  # rejected before a run directory or model load


def test_bad_env_option(capsys, tmp_path):
    assert main(["train", "--env.size", "5", "--runs_dir", str(tmp_path)]) == 2
    assert "sudoku.size" in _error_line(capsys)


def test_missing_model(capsys, tmp_path):
    args = ["train", "--model.path", str(tmp_path / "nope"), "--runs_dir", str(tmp_path)]
    assert main(args) == 2
    assert "model directory not found" in _error_line(capsys)


def test_missing_config_file(capsys, tmp_path):
    assert main(["train", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "config file not found" in _error_line(capsys)


def test_unknown_yaml_key(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("es:\n  sigmaa: 0.1\n")
    assert main(["train", "--config", str(path)]) == 2
    assert "es.sigmaa" in _error_line(capsys)


def test_envs_lists_options(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "sudoku:" in out and "--env.empty_cells" in out


def test_every_train_option_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--es.sigma" in out and "--rollout.sampling.temperature" in out and "--env.grammar" in out
    assert "(default: " in out


def test_unknown_command(capsys):
    assert main(["fly"]) == 2
