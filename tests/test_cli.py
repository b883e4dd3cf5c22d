"""The CLI turns bad input into one-line errors and wires flags into the config."""

import re

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
        (["train", "--config", "learn_sudoku_h1", "--model.backend", "vllm"], "the vllm backend does not provide"),
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
        (["eval", "--config", "learn_sudoku_h1", "--es.sigma", "1"], "unrecognized arguments: --es.sigma"),
        (["landscape", "default", "--grid", "1"], "--grid >= 2"),
        (["replay", "--steps", "2"], "the following arguments are required"),
    ],
)
def test_every_command_rejects_bad_flags_in_one_line(capsys, tmp_path, argv, message):
    assert main(argv + ["--runs_dir", str(tmp_path)] if argv[0] in ("train", "grpo", "ppo", "compare") else argv) == 2
    line = _error_line(capsys)
    assert line.startswith("esopt: error: ") and message in line, line
    assert not any(tmp_path.iterdir())  # nothing written, no model loaded


# One bad value per config section, each where a user meets it: every section's rules run at parse time,
# through the same validate() a config built in Python goes through.
SECTIONS = [
    (["train"], "--steps", "0", "steps must be >= 1"),
    (["train"], "--es.sigma", "-1", "es.sigma must be a finite number > 0"),
    (["train"], "--rollout.history_turns", "-5", "rollout.history_turns must be >= -1"),
    (["train"], "--rollout.sampling.top_k", "-1", "sampling.top_k must be >= 0"),
    (["train"], "--model.dtype", "float16", "model.dtype must be one of"),
    (["train"], "--dist.mode", "both", "dist.mode must be one of sync, async"),
    (["train"], "--env.empty_cells", "0", "sudoku.empty_cells must be an integer in 1..12"),
    (["train", "--env", "countdown"], "--env.min_numbers", "1", "countdown.min_numbers/max_numbers must satisfy"),
    (["train", "--env", "math"], "--env.max_turns", "0", "math.max_turns must be an integer >= 1"),
    (["train", "--env", "docqa"], "--env.max_turns", "0", "docqa.max_turns must be >= 1"),
    (["train", "--env", "reasoning_gym"], "--env.attempts", "0", "reasoning_gym.attempts must be an integer >= 1"),
    (["grpo"], "--optim.lr", "0", "optim.lr must be > 0"),
    (["ppo"], "--gamma", "2", "gamma and lam must be in [0, 1]"),
    (["ahd", "run"], "--eoh.pop_size", "0", "eoh.pop_size and eoh.parents must be >= 1"),
    (["ahd", "run"], "--sampling.temperature", "-1", "sampling.temperature must be >= 0"),
    (["skill", "es"], "--analyst.kind", "gpt", "analyst.kind must be one of"),
    (["skill", "es"], "--distill.group_size", "1", "distill.group_size must be >= 2"),
    (["skill", "es"], "--distill.limits.max_chars", "0", "limits.max_chars must be an integer >= 1"),
    (["compare"], "--model.device", "tpu", "model.device must be auto, cpu, cuda or cuda:N"),
    (["eval"], "--rollout.sampling.max_new_tokens", "0", "sampling.max_new_tokens must be >= 1"),
]


def _config_class(command: list[str]):
    from esopt.ahd.config import AHDConfig
    from esopt.baselines.grpo import GRPOConfig
    from esopt.baselines.ppo import PPOConfig
    from esopt.experiments.compare import CompareConfig
    from esopt.experiments.skill.config import SkillRunConfig
    from esopt.train.config import TrainConfig
    from esopt.train.evaluate import EvalConfig

    return {"train": TrainConfig, "grpo": GRPOConfig, "ppo": PPOConfig, "ahd": AHDConfig, "skill": SkillRunConfig,
            "compare": CompareConfig, "eval": EvalConfig}[command[0]]


@pytest.mark.parametrize("command, flag, value, message", SECTIONS, ids=lambda x: x if isinstance(x, str) else None)
def test_every_config_section_rejects_a_bad_value_at_parse_time(capsys, tmp_path, command, flag, value, message):
    runs_dir = [] if command[0] == "eval" else ["--runs_dir", str(tmp_path)]
    assert main(command + [flag, value] + runs_dir) == 2
    line = _error_line(capsys)
    assert line.startswith("esopt: error: ") and message in line, line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command, flag, value, message", SECTIONS, ids=lambda x: x if isinstance(x, str) else None)
def test_a_bad_value_set_in_python_fails_validate_as_the_flag_does(command, flag, value, message):
    from esopt.confutil import ConfigError, set_path

    config = _config_class(command)()
    if "--env" in command:
        config.env.name = command[command.index("--env") + 1]
    if flag.startswith("--env."):
        config.env.options[flag[len("--env."):]] = int(value)
    else:
        set_path(config, flag[2:], value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.validate()


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


def test_eval_reads_a_training_config_as_its_held_out_evaluation(tmp_path):
    """`esopt eval --config <training yaml>` evaluates what that run's own evaluations play: its model, env
    options and rollout, decoded greedily under eval_greedy and as real episodes; eval's flags still win."""
    from esopt.confutil import ConfigError
    from esopt.runconfig import parse_config
    from esopt.cli import _eval_config
    from esopt.train.evaluate import EvalConfig

    es_yaml = tmp_path / "es.yaml"
    es_yaml.write_text(
        "model: {dtype: bfloat16}\nenv: {name: sudoku, options: {empty_cells: 1, observation: marks}}\n"
        "es: {sigma: 0.005}\nrollout: {expected_reward: true, log_expected_reward: true, guided_decoding: true, "
        "sampling: {temperature: 1.0}}\n"
        "steps: 3\neval_split: val\n"
    )
    config, _ = parse_config(["--config", str(es_yaml), "--tasks", "7"], EvalConfig, "esopt eval", "", load=_eval_config)
    assert config.model.dtype == "bfloat16" and config.env.options == {"empty_cells": 1, "observation": "marks"}
    assert config.rollout.sampling.temperature == 0.0 and not config.rollout.expected_reward
    assert not config.rollout.log_expected_reward  # scoring options of ES training, not of real episodes
    assert config.rollout.guided_decoding and config.tasks == 7 and config.split == "eval"  # eval's own defaults

    grpo_yaml = tmp_path / "grpo.yaml"
    grpo_yaml.write_text("env: {name: countdown}\ngroup_size: 4\nrollout: {sampling: {temperature: 0.7}}\n")
    config = _eval_config(str(grpo_yaml))
    assert config.env.name == "countdown" and config.rollout.sampling.temperature == 0.7  # GRPO evaluates as it samples

    from esopt.baselines.grpo import GRPOConfig
    from esopt.baselines.ppo import PPOConfig

    for kind in (GRPOConfig, PPOConfig):  # a run directory's config.yaml holds every field of its method
        run = kind()
        run.env.options, run.eval_env_options = {"empty_cells": 3, "max_turns": 1, "partial_credit": True}, {"max_turns": 3}
        dumped = tmp_path / f"{kind.__name__}.yaml"
        dumped.write_text(run.to_yaml())
        assert _eval_config(str(dumped)).env.options == {"empty_cells": 3, "max_turns": 3, "partial_credit": True}

    es_yaml.write_text("es: {sigmaa: 0.1}\n")
    with pytest.raises(ConfigError, match="es.sigmaa"):  # a typo in a training config is named as one
        _eval_config(str(es_yaml))
