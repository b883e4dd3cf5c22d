"""Batched multi-turn agent loop: every live episode advances one turn per batched generate call."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from esopt.confutil import Config, ConfigError, opt
from esopt.envs.base import Env, Task
from esopt.es import Member, derive_seed
from esopt.policy.base import Policy, SamplingConfig


MAX_EXPECTED_REPLIES = 256
"""rollout.expected_reward: the most replies an episode's action grammar may admit."""
LOG_REWARD_FLOOR = 1e-4
"""rollout.log_expected_reward: expected rewards below this count as this (log 0 is -inf)."""


@dataclass
class RolloutConfig(Config):
    guided_decoding: bool = opt(True, "constrain replies to the env's action regex when the env declares one")
    history_turns: int = opt(-1, "past turns kept in the prompt: -1 = all, 0 = only the current observation")
    sampling: SamplingConfig = opt(SamplingConfig(), "decoding settings")
    skill: str = opt("", "path of a skill document (SKILL.md) appended to the system prompt ('' = none)")
    expected_reward: bool = opt(
        False,
        "score each episode by its exact expected reward instead of one sampled reply: every reply the action "
        "grammar admits is scored by the env, and weighted by its probability under the model at "
        "sampling.temperature (p(reply)^(1/T), normalised over the replies; top_k and top_p are not applied; "
        "a reply's text after its last choice, which the grammar forces, is not scored). "
        f"For envs whose episodes end after one reply and whose grammar admits at most {MAX_EXPECTED_REPLIES} replies "
        "(sudoku with empty_cells 1, countdown's operators grammar); ES training only, evaluation plays real episodes",
    )
    log_expected_reward: bool = opt(
        False,
        "with expected_reward: score each episode by the log of its expected reward (below 1e-4 counted as 1e-4), so "
        "a member's fitness is the mean log over its tasks: raising a task's success from 1% to 2% counts as much "
        "as from 40% to 80%, which keeps ES from trading away the tasks of one answer for the others' (the mean of "
        "expected rewards left each Sudoku H*=1 seed one digit it never got right)",
    )

    def real_episodes(self) -> "RolloutConfig":
        """These settings with the replies played, not scored (held-out evaluation, probes): expected_reward and
        what depends on it off."""
        return replace(self, expected_reward=False, log_expected_reward=False)

    def check(self) -> None:
        if self.log_expected_reward and not self.expected_reward:
            raise ConfigError("rollout.log_expected_reward takes the log of the expected reward: it needs rollout.expected_reward")
        if self.history_turns < -1:
            raise ConfigError(f"rollout.history_turns must be >= -1, got {self.history_turns}")
        if self.expected_reward and not self.guided_decoding:
            raise ConfigError("rollout.expected_reward enumerates the replies the action grammar admits: it needs rollout.guided_decoding")
        if self.expected_reward and self.sampling.greedy:
            raise ConfigError("rollout.expected_reward weights replies at the sampling temperature: set rollout.sampling.temperature > 0")


@dataclass
class Trajectory:
    task_id: str
    messages: list[dict] = field(default_factory=list)
    """The whole conversation: system prompt, observations (user) and actions (assistant)."""
    actions: list[str] = field(default_factory=list)
    feedback: list[str] = field(default_factory=list)
    """The observation returned after each action."""
    rewards: list[float] = field(default_factory=list)
    invalid: list[bool] = field(default_factory=list)
    success: bool = False
    done: bool = False
    final_info: dict = field(default_factory=dict)
    """The env's info dict from the last turn (e.g. success, category, anls)."""
    skill_version: str = ""
    """Version and content hash ("v3-1a2b3c4d") of the skill document in the system prompt; "" = none."""
    generated_tokens: int = 0
    """Tokens the policy generated over all turns (0 when its backend does not count them)."""

    @property
    def reward(self) -> float:
        return float(sum(self.rewards))

    @property
    def turns(self) -> int:
        return len(self.actions)

    def to_json(self) -> dict:
        return {**asdict(self), "reward": self.reward, "turns": self.turns}


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    generate_s: float
    env_s: float

    @property
    def generated_tokens(self) -> int:
        return sum(t.generated_tokens for t in self.trajectories)

    @property
    def metrics(self) -> dict[str, float]:
        trajectories = self.trajectories
        n = max(1, len(trajectories))
        actions = sum(t.turns for t in trajectories)
        return {
            "mean_reward": sum(t.reward for t in trajectories) / n,
            "success": sum(t.success for t in trajectories) / n,
            "mean_turns": actions / n,
            "invalid_rate": sum(sum(t.invalid) for t in trajectories) / max(1, actions),
        }


def _prompt(messages: list[dict], history_turns: int) -> list[dict]:
    """System message + the last `history_turns` exchanges + the current observation."""
    if history_turns < 0:
        return messages
    system, rest = messages[:1], messages[1:]
    keep = 2 * history_turns + 1
    return system + rest[-keep:]


def system_prompt(env: Env, config: RolloutConfig) -> tuple[str, str]:
    """The env's system prompt with the skill document (if any) after it, and the skill's version tag."""
    if not config.skill:
        return env.system_prompt, ""
    from esopt.skills.document import SkillError, load_cached

    try:
        skill = load_cached(config.skill)
    except SkillError as e:
        raise ConfigError(f"rollout.skill: {e}") from None
    return f"{env.system_prompt}\n\n{skill.text.strip()}", skill.tag


def rollout(
    policy: Policy,
    env: Env,
    tasks: list[Task],
    config: RolloutConfig,
    seed: int = 0,
    members: list[Member | None] | None = None,
) -> RolloutResult:
    """Run one episode per task to completion; episodes end on done (envs enforce their max_turns).
    `members` (one per task) plays each episode with its ES member's weights in one batched generate
    (population batching; see Policy.generate)."""
    if members is not None and len(members) != len(tasks):
        raise ValueError(f"rollout got {len(tasks)} tasks but {len(members)} members")
    if config.expected_reward:
        return expected_rollout(policy, env, tasks, config, members)
    episodes = [env.start(task) for task in tasks]
    system, skill_version = system_prompt(env, config)
    trajectories = [
        Trajectory(
            task_id=task.id,
            skill_version=skill_version,
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": episode.observation},
            ],
        )
        for task, episode in zip(tasks, episodes)
    ]
    live = list(range(len(tasks)))
    generate_s = env_s = 0.0
    turn = 0
    while live:
        chats = [_prompt(trajectories[i].messages, config.history_turns) for i in live]
        start = time.perf_counter()
        regexes = [(episodes[i].action_regex or env.action_regex) if config.guided_decoding else None for i in live]
        row_members = {} if members is None else {"members": [members[i] for i in live]}
        replies = policy.generate(chats, config.sampling, action_regex=regexes, seed=derive_seed(seed, turn), **row_members)
        generate_s += time.perf_counter() - start
        lengths = list(getattr(policy, "last_reply_tokens", ()))  # duck-typed policies may not count
        if len(lengths) == len(live):
            for i, length in zip(live, lengths):
                trajectories[i].generated_tokens += length
        start = time.perf_counter()
        still_live = []
        for i, reply in zip(live, replies):
            result = episodes[i].step(reply)
            trajectory = trajectories[i]
            trajectory.actions.append(reply)
            trajectory.feedback.append(result.observation)
            trajectory.rewards.append(float(result.reward))
            trajectory.invalid.append(bool(result.info.get("invalid", False)))
            trajectory.messages.append({"role": "assistant", "content": reply})
            if result.done:
                trajectory.done = True
                trajectory.final_info = _jsonable(result.info)
                trajectory.success = bool(result.info.get("success", trajectory.reward >= 1.0))
            else:
                trajectory.messages.append({"role": "user", "content": result.observation})
                still_live.append(i)
        env_s += time.perf_counter() - start
        live = still_live
        turn += 1
        if turn > 10_000:
            raise RuntimeError(f"env {env.name!r} never ended an episode; it must enforce max_turns")
    return RolloutResult(trajectories, generate_s, env_s)


def admitted_replies(regex: str | None) -> list[str]:
    """Every string `regex` matches in full (its language), when that is finite and small; else ConfigError."""
    import exrex

    if regex is None:
        raise ConfigError("rollout.expected_reward needs an env with an action grammar (action_regex)")
    count = exrex.count(regex, limit=MAX_EXPECTED_REPLIES)
    if count > MAX_EXPECTED_REPLIES or count != exrex.count(regex, limit=MAX_EXPECTED_REPLIES + 1):
        raise ConfigError(
            f"rollout.expected_reward: the action grammar {regex!r} admits more than {MAX_EXPECTED_REPLIES} replies"
        )
    return list(exrex.generate(regex, limit=MAX_EXPECTED_REPLIES))


def choice_prefixes(replies: list[str]) -> list[str]:
    """Each reply cut just after its last choice: the character where it parts from the reply closest to it
    (sorted neighbours share the longest prefixes). No other reply starts with the cut text, so the grammar
    forces the rest and guided decoding writes it without a choice; scoring it would cost a forward row per
    reply (countdown's `(a o b) o c`: 4 rows per task instead of 16). A lone reply, or one that is a prefix
    of another, is kept whole (sudoku's `set r c d` is: its last character is the choice)."""
    if len(replies) < 2:
        return list(replies)
    order = sorted(range(len(replies)), key=replies.__getitem__)
    shared = [0] * len(replies)
    for left, right in zip(order, order[1:]):
        a, b = replies[left], replies[right]
        common = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shared[left] = max(shared[left], common)
        shared[right] = max(shared[right], common)
    return [reply[: shared[i] + 1] for i, reply in enumerate(replies)]


def expected_rollout(
    policy: Policy, env: Env, tasks: list[Task], config: RolloutConfig, members: list[Member | None] | None = None
) -> RolloutResult:
    """One-reply episodes scored by their exact expected reward: every reply the episode's grammar admits is
    played on a fresh episode, and its reward weighted by softmax(log p(reply) / temperature) over the replies.
    Each trajectory holds the likeliest reply, with the expected reward as its reward; `success` is the
    likeliest reply's, and final_info["success_probability"] the expected success."""
    import math

    system, skill_version = system_prompt(env, config)
    chats, candidates = [], []
    start = time.perf_counter()
    for task in tasks:
        episode = env.start(task)
        chats.append([{"role": "system", "content": system}, {"role": "user", "content": episode.observation}])
        candidates.append(admitted_replies(episode.action_regex or env.action_regex))
    env_s = time.perf_counter() - start
    start = time.perf_counter()
    logprobs = policy.reply_logprobs(chats, [choice_prefixes(replies) for replies in candidates], members=members)
    generate_s = time.perf_counter() - start
    start = time.perf_counter()
    trajectories = []
    temperature = config.sampling.temperature
    for task, chat, replies, scores in zip(tasks, chats, candidates, logprobs):
        top = max(scores)
        weights = [math.exp((score - top) / temperature) for score in scores]
        total = sum(weights)
        reward = success = 0.0
        likeliest = None
        for reply, weight in zip(replies, weights):
            result = env.start(task).step(reply)
            if not result.done:
                raise ConfigError(
                    f"rollout.expected_reward needs episodes that end after one reply; {env.name} task {task.id} "
                    f"goes on after {reply!r}"
                )
            won = bool(result.info.get("success", result.reward >= 1.0))
            reward += weight / total * float(result.reward)
            success += weight / total * won
            if likeliest is None or weight > likeliest[1]:
                likeliest = (reply, weight, result, won)
        reply, _, result, won = likeliest
        trajectories.append(
            Trajectory(
                task_id=task.id,
                skill_version=skill_version,
                messages=[*chat, {"role": "assistant", "content": reply}],
                actions=[reply],
                feedback=[result.observation],
                rewards=[math.log(max(reward, LOG_REWARD_FLOOR)) if config.log_expected_reward else reward],
                invalid=[bool(result.info.get("invalid", False))],
                success=won,
                done=True,
                final_info={
                    **_jsonable(result.info), "success_probability": success, "expected_reward": reward,
                    "replies_scored": len(replies),
                },
            )
        )
    env_s += time.perf_counter() - start
    return RolloutResult(trajectories, generate_s, env_s)


def _jsonable(info: dict) -> dict:
    return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for k, v in info.items()}
