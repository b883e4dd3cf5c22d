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


# ---- one config path: every command, the same one-line error at parse time -----------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--es.sigma", "-1"], "es.sigma must be a finite number > 0"),
        (["train", "--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
        (["train", "--run_name", "a/b"], "run_name must be a plain directory name"),
        (["grpo", "--steps", "0"], "steps must be >= 1"),
        (["ppo", "--seed", "x"], "seed expects int"),
        (["compare", "--budget_episodes", "0"], "budget_episodes, eval_tasks and eval_points must be >= 1"),
        (["compare", "--steps", "3"], "unrecognized arguments: --steps"),
        (["skill", "es", "--samples", "0"], "samples must be >= 1"),
        (["ahd", "run", "--budget", "0"], "budget must be an integer >= 1"),
        (["ahd", "run", "--es.population", "4"], "unrecognized arguments: --es.population"),
        (["ahd", "nope"], "unknown subcommand esopt ahd 'nope'"),
        (["eval", "--split", "test"], "split must be one of train, val, eval"),
        (["eval", "--tasks", "0"], "--tasks and --samples must be >= 1"),
        (["landscape", "default", "--grid", "1"], "--grid >= 2"),
        (["replay", "--steps", "2"], "the following arguments are required"),
    ],
)
def test_every_command_rejects_bad_flags_in_one_line(capsys, tmp_path, argv, message):
    assert main(argv + ["--runs_dir", str(tmp_path)] if argv[0] in ("train", "grpo", "ppo", "compare") else argv) == 2
    line = _error_line(capsys)
    assert line.startswith("esopt: error: ") and message in line, line
    assert not any(tmp_path.iterdir())  # nothing written, no model loaded


def test_resume_with_a_corrupt_history_line_is_a_one_line_error(capsys, tmp_path, quadratic_es_run):
    from esopt.es import ESConfig
    from esopt.train.config import TrainConfig

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(TrainConfig().to_yaml())
    _, _, _, history = quadratic_es_run(tmp_path, 3, ESConfig(population=4))
    lines = history.read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # a torn record in the middle, not at the end
    (run / "history.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["train", "--resume", str(run)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"esopt: error: run directory {run} is damaged: ") and "history.jsonl:2: corrupt history line" in line
    assert main(["replay", str(run), "--out", str(tmp_path / "out")]) == 2
    assert "history.jsonl:2: corrupt history line" in _error_line(capsys)


def test_version(capsys):
    from esopt import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"esopt {__version__}"


def test_every_run_config_shares_the_run_directory_rules(tmp_path):
    from esopt.ahd.config import AHDConfig
    from esopt.baselines.grpo import GRPOConfig
    from esopt.confutil import ConfigError
    from esopt.experiments.compare import CompareConfig
    from esopt.runconfig import RunConfig
    from esopt.train.config import TrainConfig

    expected = {TrainConfig: "sudoku__agentic-esopt__7__", GRPOConfig: "sudoku__grpo__7__",
                AHDConfig: "ahd_tsp20__sample__7__", CompareConfig: "sudoku__compare__7__"}
    for cls, prefix in expected.items():
        config = cls(seed=7, runs_dir=str(tmp_path / cls.__name__))
        assert isinstance(config, RunConfig)
        run_dir = config.create_run_dir()
        assert run_dir.parent == tmp_path / cls.__name__ and run_dir.name.startswith(prefix), run_dir
        assert (run_dir / "config.yaml").read_text() == config.to_yaml()
        (run_dir / cls.run_marker).write_text("")  # the directory now holds a run of this kind
        config.run_name = run_dir.name
        with pytest.raises(ConfigError, match="already holds a run"):
            config.create_run_dir()
