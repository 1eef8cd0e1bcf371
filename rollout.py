"""Rollouts and held-out evaluation: the agents playing episodes of the Flex-POMDP.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "Flex-POMDP" and the algorithm box's sampling
phase. At every step t the agents act in the topological order σ of D; agent j samples
a^j_t ~ π^j(· | ô^j_t) from its unrolled observation

    ô^j_t = o^j_t ⊕ {a^i_t : D(a^i, a^j) = 1}                         (Flex-POMDP observation)

and the joint action a_t goes to the environment, which returns the team reward R_t and done_t.
Training and evaluation both play through `run_episodes`. With an orchestrator (a dynamic D,
flex_pomdp's docstring) a step is the sequence its decisions call (`play_orchestrated_step`).

A `Rollout` keeps every learning agent's action as one sample s at its position k in the step (a tool's
action is in the transcript only); `to_grid` puts a per-sample table on the [B, T, P, …] grid the advantage
equations index. The critic's input o_t ⊕ a_{t,<k} is the policy's prompt in a chain or an orchestrated
step; under any other fixed D it is tokenized beside it (`Rollout.critic_prompt_ids`). Held-out metrics:
`heldout_metrics` (docs/metrics.md).
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

import agents as agents_lib
import distributed
import generation
import tasks
import tools
from envs import Grader, Problem, extract_boxed
from envs.grader import CORRECT
from flex_pomdp import (FINISH, TEAM_ANSWER, Organisation, critic_messages, joint_observation, own_observation,
                        parse_decision, realised_messages, unrolled_messages)
from config import Config, role_temperatures

# (prompt ids, adapter name or None for the base model, sampling) → Actions
GenerateActions = Callable[[list[list[int]], "str | None", generation.Sampling], generation.Actions]


@dataclass
class Rollout:
    """Every action of a batch of episodes, flattened: sample s is agent agent_index[s] (its index
    in σ), the position[s]-th action of step step[s] of episode episode[s]."""
    prompt_ids: list[list[int]] = field(default_factory=list)  # ô: what the policy read
    # s → the critic's input o_t ⊕ a_{t,<k}, only where it is not prompt_ids[s] (module docstring)
    critic_prompt_ids: dict[int, list[int]] = field(default_factory=dict)
    response_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    generation_logprobs: list[list[float]] = field(default_factory=list)  # per token, from the backend
    episode: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    agent_index: list[int] = field(default_factory=list)
    position: list[int] = field(default_factory=list)  # k: the k-th learning agent's action of its step
    role_reward: list[float] = field(default_factory=list)  # the agent's per-role reward terms (profile)
    team_reward: torch.Tensor | None = None  # [B, T]
    dones: torch.Tensor | None = None  # [B, T]
    step_mask: torch.Tensor | None = None  # [B, T], 1 where the step happened
    solved: list[bool] = field(default_factory=list)  # [B]: the graded answers were right at the end
    outcomes: list[list[dict[str, str]]] = field(default_factory=list)  # [B][t]: graded role → outcome
    infos: list[list[dict]] = field(default_factory=list)  # [B][t]: the info dict of env.step
    unparseable: int = 0  # graded answers with no parseable \boxed{}
    ungraded: int = 0  # graded answers whose check timed out or crashed the grader
    graded_answers: int = 0
    program_outcomes: Counter[str] = field(default_factory=Counter)  # sandbox outcome → graded programs
    truncated_prompts: int = 0  # prompts (and critic inputs) cut at max_prompt_tokens
    generation_seconds: float = 0.0
    # Orchestrated only: [B][t] the executors called, and how the step ended ("finish", "max_calls", "error: <why>")
    calls: list[list[list[str]]] = field(default_factory=list)
    step_ends: list[list[str]] = field(default_factory=list)

    def agent_samples(self, agent: int) -> list[int]:
        """The samples s of agent σ[agent], in rollout order."""
        return [s for s, n in enumerate(self.agent_index) if n == agent]

    def sequences(self, samples, reader: str = "policy") -> tuple[list[list[int]], list[list[int]]]:
        """(prompt ids, response ids) of the samples: the prompts ô they were drawn from, or the critic's o_t ⊕ a_{t,<k}."""
        assert reader in ("policy", "critic"), reader
        samples = [int(s) for s in samples]
        own = self.critic_prompt_ids if reader == "critic" else {}  # the critic's, where it is not the policy's
        return [own.get(s, self.prompt_ids[s]) for s in samples], [self.response_ids[s] for s in samples]

    def to_grid(self, table: torch.Tensor) -> torch.Tensor:
        """A per-sample table [S, ...] on [B, T, P, ...], P the most actions of a step (N under a fixed D)."""
        B, T = self.step_mask.shape
        out = torch.zeros(B, T, max(self.position) + 1, *table.shape[1:], dtype=table.dtype)
        out[self.episode, self.step, self.position] = table
        return out

    def record(self, prompt_ids: list[int], response_ids: list[int], logprobs: list[float], text: str, episode: int,
               step: int, agent: int, position: int, critic_prompt_ids: list[int] | None = None) -> int:
        """Append one action (critic_prompt_ids None: the critic reads prompt_ids); returns its sample s."""
        for column, value in ((self.prompt_ids, prompt_ids), (self.response_ids, response_ids), (self.texts, text),
                              (self.generation_logprobs, logprobs), (self.episode, episode), (self.step, step),
                              (self.agent_index, agent), (self.position, position), (self.role_reward, 0.0)):
            column.append(value)
        s = len(self.prompt_ids) - 1
        if critic_prompt_ids is not None:
            self.critic_prompt_ids[s] = critic_prompt_ids
        return s


def run_episodes(generate_actions: GenerateActions, tokenizer, org: Organisation, problems: list[Problem],
                 grader: Grader, sampling: generation.Sampling, cfg: Config) -> Rollout:
    """One episode per problem; under torchrun rank r plays r, r + G, … with its own noise (`merge_rollouts`)."""
    if distributed.world_size() == 1:
        return play_episodes(generate_actions, tokenizer, org, problems, grader, sampling, cfg)
    distributed.reseed_sampling()
    part = play_episodes(generate_actions, tokenizer, org, distributed.shard(problems), grader, sampling, cfg)
    return merge_rollouts(distributed.all_gather_objects(part))


def play_episodes(generate_actions: GenerateActions, tokenizer, org: Organisation, problems: list[Problem],
                  grader: Grader, sampling: generation.Sampling, cfg: Config) -> Rollout:
    """One episode per problem: at each step the agents act in σ order or as the orchestrator decides."""
    B, T = len(problems), cfg.horizon
    task = tasks.task_of(cfg)
    context = episode_context(org, grader)
    envs = [tasks.make_env(task, p, cfg, context) for p in problems]
    observations = [env.reset() for env in envs]
    out = empty_rollout(B, T, orchestrated=bool(org.orchestrator))
    temperatures = role_temperatures(cfg)
    def act(role: str, episodes: list[int], transcripts: dict[int, list[tuple[str, str]]], t: int) -> list[tuple[int, str]]:
        """a ~ π^role(· | ô) in each episode, ô from the step's transcript: [(sample s, text)] (s None: a tool)."""
        if org.profile(role).tool:
            return play_tool(org, role, [transcripts[b] for b in episodes])
        if org.orchestrator:  # ô = o_t ⊕ every earlier action of the step (the realised D_t)
            messages = [realised_messages(org, role, own_observation(observations[b], role), transcripts[b]) for b in episodes]
        else:  # ô^j_t = o^j_t ⊕ {a^i_t : D(a^i, a^j) = 1}
            messages = [unrolled_messages(org, role, own_observation(observations[b], role), dict(transcripts[b]))
                        for b in episodes]
        prompt_ids, truncated = agents_lib.tokenize_prompts(tokenizer, messages, cfg.max_prompt_tokens)
        critic_ids, critic_truncated = [None] * len(episodes), 0  # None: the critic reads ô (or there is no critic)
        own_views = any(isinstance(observations[b], dict) for b in episodes)  # o^j_t ≠ o_t: the critic reads o_t
        if cfg.advantage == "gae" and (own_views or not org.reads_every_earlier_action(role)):  # its own input o_t ⊕ a_{t,<k}
            critic_ids, critic_truncated = agents_lib.tokenize_prompts(tokenizer, [critic_messages(
                org, role, joint_observation(org, observations[b]), transcripts[b]) for b in episodes], cfg.max_prompt_tokens)
        started = time.perf_counter()
        own = sampling if sampling.temperature == 0 or role not in temperatures else replace(sampling, temperature=temperatures[role])
        actions = generate_actions(prompt_ids, agents_lib.policy_adapter_name(role, cfg.shared_adapter), own)  # own: its T
        out.generation_seconds += time.perf_counter() - started
        out.truncated_prompts += truncated + critic_truncated
        texts = tokenizer.batch_decode(actions.token_ids, skip_special_tokens=True)
        taken = []
        for k, b in enumerate(episodes):
            s = out.record(prompt_ids[k], actions.token_ids[k], actions.logprobs[k], texts[k], b, t,
                           org.order.index(role), learning_position(org, transcripts[b]), critic_ids[k])
            transcripts[b].append((role, texts[k]))
            taken.append((s, texts[k]))
        return taken

    active = list(range(B))
    for t in range(T):
        if not active:  # every episode has ended (or this rank was given none)
            break
        transcripts: dict[int, list[tuple[str, str]]] = {b: [] for b in active}  # (role, text) in the order taken
        samples: dict[int, list[int]] = {b: [] for b in active}  # the sample index s of each action
        if org.orchestrator:
            play_orchestrated_step(org, active, lambda role, episodes: act(role, episodes, transcripts, t), samples, out, t)
        else:
            for role in org.order:  # a^j_t ~ π^j(· | ô^j_t), in σ order
                for b, (s, _) in zip(active, act(role, active, transcripts, t)):
                    if s is not None:  # a tool's action is in the transcript, not among the samples
                        samples[b].append(s)
        for b in list(active):
            observations[b], done = step_environment(envs[b], task, org, transcripts[b], samples[b], out, b, t,
                                                     cfg.tool_call_cost, problem=problems[b])
            if done:
                active.remove(b)
    return out


def play_tool(org: Organisation, role: str, step_transcripts: list[list[tuple[str, str]]]) -> list[tuple[None, str]]:
    """A tool's action (tools.py: a fixed π^j) on what D gives it (orchestrated: all) in each step's transcript."""
    for transcript in step_transcripts:
        read = "\n".join(text for parent, text in transcript if org.orchestrator or parent in org.parents(role))
        transcript.append((role, tools.tool_action(org.profile(role).tool, read)))
    return [(None, transcript[-1][1]) for transcript in step_transcripts]


def learning_position(org: Organisation, transcript: list[tuple[str, str]]) -> int:
    """k of the next learning agent's action in its step (a tool's action takes no place)."""
    return sum(1 for role, _ in transcript if not org.profile(role).tool)


def empty_rollout(B: int, T: int, orchestrated: bool) -> Rollout:
    """A rollout of B episodes of at most T steps before any action."""
    return Rollout(team_reward=torch.zeros(B, T), dones=torch.zeros(B, T), step_mask=torch.zeros(B, T), solved=[False] * B,
                   outcomes=[[] for _ in range(B)], infos=[[] for _ in range(B)], calls=[[] for _ in range(B)] if orchestrated else [],
                   step_ends=[[] for _ in range(B)] if orchestrated else [])


def episode_context(org: Organisation, grader: Grader) -> tasks.EpisodeContext:
    """What every environment of the organisation's episodes is built with (tasks.EpisodeContext)."""
    return tasks.EpisodeContext(graded_roles=(TEAM_ANSWER,) if org.orchestrator else org.graded_roles, grader=grader,
                                role_rewards={a.role: a.rewards for a in org.agents})


def env_step(env, task, org: Organisation, transcript: list[tuple[str, str]], where: str):
    """env.step(a_t), a_t from the step's transcript [(role, text)]: role → its (last) action; its info checked;
    what it raises comes back as a RuntimeError naming `where`."""
    joint_action = dict(transcript)
    if org.orchestrator:  # the team's answer: the last graded executor's action ("" if none acted)
        joint_action[TEAM_ANSWER] = next((text for role, text in reversed(transcript) if role in org.graded_roles), "")
    try:
        observation, reward, done, info = env.step(joint_action)
    except Exception as error:
        said = " ".join(str(error).split())
        said = said if len(said) <= 200 else said[:200] + "…"
        raise RuntimeError(f"task {task.name}: its environment's step() raised {type(error).__name__}"
                           f"{f' ({said})' if said else ''} on {where}, acting: {', '.join(joint_action)} "
                           "(the task's own traceback is above)") from error
    tasks.check_step_info(task, info)
    return observation, reward, done, info


def problem_label(index: int, problem: Problem | None) -> str:
    """How a message names a problem: "problem 3 ('What is 7 + 5?')"."""
    text = "" if problem is None else " ".join(problem.problem.split())
    return f"problem {index}" + (f" ({text if len(text) <= 60 else text[:60] + '…'!r})" if text else "")


def check_environment(cfg: Config, org: Organisation, problems: dict[str, tuple[int, Problem]]) -> None:
    """A step with empty actions in each of `problems` ({split: (index, problem)}) before the run folder is written."""
    task = tasks.task_of(cfg)
    with Grader() as grader:
        context = episode_context(org, grader)
        for split, (index, problem) in problems.items():
            env = tasks.make_env(task, problem, cfg, context)
            views = env.reset()
            unseen = [a.role for a in org.agents if not a.tool and isinstance(views, dict) and a.role not in views]
            if unseen:
                raise ValueError(f"task {task.name}: its environment's reset() gives each role its own observation, "
                                 f"but none to {', '.join(unseen)}: give every agent of the organisation one")
            env_step(env, task, org, [(role, "") for role in org.order],
                     f"{split} {problem_label(index, problem)}, step 0 (a trial step with empty actions, before the run folder)")


def step_environment(env, task, org: Organisation, transcript: list[tuple[str, str]], step_samples: list[int], out: Rollout,
                     b: int, t: int, cost_per_tool_call: float = 0.0, problem: Problem | None = None):
    """env.step(a_t) → (o_{t+1}, done_t) of episode b, a_t from the step's transcript (samples `step_samples`);
    R_t − c · (tool calls), done_t and the info (role rewards, outcomes, `tool_use`) recorded in `out`."""
    observation, reward, done, info = env_step(env, task, org, transcript,
                                               f"{problem_label(b, problem)} of the rollout, step {t}")
    info["tools"] = tool_use(org, transcript)
    reward -= cost_per_tool_call * info["tools"]["calls"]  # R_t − c · (tool calls of the step)
    out.team_reward[b, t], out.dones[b, t], out.step_mask[b, t] = reward, float(done), 1.0
    out.solved[b] = info["correct"]
    last_sample = {org.order[out.agent_index[s]]: s for s in step_samples}  # a role's terms score its last action
    for role, value in info.get("role_rewards", {}).items():
        out.role_reward[last_sample[role]] = value
    out.outcomes[b].append(dict(info["outcomes"]))
    out.infos[b].append(info)
    out.unparseable += sum(o == "unparseable" for o in info["outcomes"].values())
    out.ungraded += sum(o == "ungraded" for o in info["outcomes"].values())
    out.graded_answers += len(info["outcomes"])
    out.program_outcomes.update(info.get("program_outcomes", {}).values())
    return observation, done


def tool_use(org: Organisation, transcript: list[tuple[str, str]]) -> dict:
    """What the tools did in one step: {"calls", "errors" (outputs holding an error), "answer_is_tool_output":
    whether the graded answer is the last value a tool gave, None when none gave one}."""
    tool_actions = [(org.profile(role).tool, text) for role, text in transcript if org.profile(role).tool]
    values = [value for tool, text in tool_actions if (value := tools.tool_value(tool, text)) is not None]
    graded = [text for role, text in transcript if role in org.graded_roles]
    answer = extract_boxed(graded[-1]) if graded else None
    same = None if not values else answer is not None and answer.replace(",", "").strip() == values[-1]
    return {"calls": len(tool_actions), "errors": sum("error:" in text for _, text in tool_actions), "answer_is_tool_output": same}


def tool_metrics(rollout: Rollout, org: Organisation, prefix: str) -> dict[str, float]:
    """tools/calls_per_episode, error_rate, answer_is_tool_output of the steps (`tool_use`); empty without tools."""
    if org.learners == org.order:
        return {}
    used = [info["tools"] for steps in rollout.infos for info in steps]
    calls = sum(u["calls"] for u in used)
    valued = [u["answer_is_tool_output"] for u in used if u["answer_is_tool_output"] is not None]
    return {f"{prefix}/tools/calls_per_episode": calls / len(rollout.infos),
            f"{prefix}/tools/error_rate": sum(u["errors"] for u in used) / max(calls, 1),
            f"{prefix}/tools/answer_is_tool_output": sum(valued) / max(len(valued), 1)}


def task_metrics(rollout: Rollout, cfg: Config, prefix: str) -> dict[str, float]:
    """The task's own metrics (tasks.Task.metrics) of every step played, as `<prefix>/<name>`."""
    measure = tasks.task_of(cfg).metrics or (lambda infos: {})
    return {f"{prefix}/{name}": value for name, value in measure([info for steps in rollout.infos for info in steps]).items()}


def merge_rollouts(parts: list[Rollout]) -> Rollout:
    """The rollout of G ranks' parts as one process would have played it: part r's episode j is episode
    r + jG, the samples in the order of play (step, position, agent, episode), as one process's."""
    G, T = len(parts), parts[0].team_reward.shape[1]
    out = empty_rollout(sum(len(part.solved) for part in parts), T, orchestrated=any(part.calls for part in parts))
    order = []  # (step, position, agent, episode, part, local sample)
    for r, part in enumerate(parts):
        for name in ("team_reward", "dones", "step_mask", "solved", "outcomes", "infos", "calls", "step_ends"):
            getattr(out, name)[r::G] = getattr(part, name)  # per-episode fields: episodes r, r + G, …
        out.program_outcomes.update(part.program_outcomes)  # Counter.update adds the counts
        order += [(part.step[s], part.position[s], part.agent_index[s], r + part.episode[s] * G, r, s)
                  for s in range(len(part.prompt_ids))]
    for step, position, agent, b, r, s in sorted(order):
        part = parts[r]
        new = out.record(part.prompt_ids[s], part.response_ids[s], part.generation_logprobs[s], part.texts[s], b, step, agent, position,
                         part.critic_prompt_ids.get(s))
        out.role_reward[new] = part.role_reward[s]
    for counter in ("unparseable", "ungraded", "graded_answers", "truncated_prompts"):
        setattr(out, counter, sum(getattr(part, counter) for part in parts))
    out.generation_seconds = max(part.generation_seconds for part in parts)  # the ranks generate side by side
    return out


def play_orchestrated_step(org: Organisation, episodes: list[int], act, samples: dict[int, list[int]], out: Rollout, t: int):
    """One step of a dynamic D: orchestrator, executor, orchestrator, … until the orchestrator finishes,
    errs or max_calls executors have acted; `act(role, episodes)` → [(s, text)], one batch per role."""
    for b in episodes:
        out.calls[b].append([])
        out.step_ends[b].append("")
    deciding = list(episodes)
    while deciding:
        called: dict[str, list[int]] = {}
        for b, (s, text) in zip(deciding, act(org.orchestrator, deciding)):
            samples[b].append(s)
            decision = parse_decision(text, org.executors)
            if decision.kind == "call":
                called.setdefault(decision.role, []).append(b)
            else:  # finish, or an error: the step ends as it stands
                out.step_ends[b][t] = FINISH if decision.kind == "finish" else f"error: {decision.error}"
        deciding = []
        for role in [role for role in org.executors if role in called]:
            for b, (s, _) in zip(called[role], act(role, called[role])):
                if s is not None:  # a tool's call is in the transcript and the calls, not among the samples
                    samples[b].append(s)
                out.calls[b][t].append(role)
                if len(out.calls[b][t]) == org.max_calls:
                    out.step_ends[b][t] = "max_calls"
                else:
                    deciding.append(b)
        deciding.sort()


def orchestration_metrics(rollout: Rollout, org: Organisation, prefix: str = "charts") -> dict[str, float]:
    """The realised D_t (empty for a fixed D): calls per episode and per role, how the steps ended (docs/metrics.md)."""
    if not org.orchestrator:
        return {}
    episodes, ends = len(rollout.calls), [end for steps in rollout.step_ends for end in steps]
    called = [role for steps in rollout.calls for step in steps for role in step]
    ended = {"finish_rate": ends.count(FINISH), "max_calls_rate": ends.count("max_calls"),
             "orchestration_errors": sum(end.startswith("error") for end in ends)}
    return ({f"{prefix}/calls_per_episode": len(called) / episodes}
            | {f"{prefix}/calls/{role}": called.count(role) / episodes for role in org.executors}
            | {f"{prefix}/{name}": count / len(ends) for name, count in ended.items()})


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) from n ≥ k samples, c of them correct: 1 − C(n − c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(answers: list, solved: list[bool], same: Callable[[object, object], bool]) -> float:
    """Whether the majority answer of one problem's samples is right: answers (None: no vote) join the first
    group whose first is `same`; a tie of largest groups scores the fraction of them solved; 0.0 without."""
    groups: list[list[int]] = []  # sample indices, grouped
    for i in [i for i, answer in enumerate(answers) if answer is not None]:
        group = next((g for g in groups if same(answers[g[0]], answers[i])), [])
        if not group:  # a new answer: a new group
            groups.append(group)
        group.append(i)
    if not groups:
        return 0.0
    largest = max(map(len, groups))
    winners = [g for g in groups if len(g) == largest]
    return sum(solved[g[0]] for g in winners) / len(winners)


def has_answers(rollout: Rollout) -> bool:
    """Whether every episode's environment said what was answered (info["answers"]: MathEnv does)."""
    return bool(rollout.infos) and all(steps and "answers" in steps[-1] for steps in rollout.infos)


def maj_at_k(rollout: Rollout, num_problems: int, k: int, same: Callable[[object, object], bool]) -> float:
    """maj@k: the mean `majority_vote` over problems p and the n // k blocks of k of their n samples (b mod P = p)."""
    samples = len(rollout.solved) // num_problems
    if not 1 <= k <= samples:
        raise ValueError(f"maj@{k} needs 1 ≤ k ≤ the {samples} samples per problem: take k ≤ {samples} or more samples")
    blocks = samples // k
    total = 0.0
    for p in range(num_problems):
        for i in range(blocks):
            block = [p + j * num_problems for j in range(i * k, (i + 1) * k)]  # samples ik … (i + 1)k − 1 of problem p
            answers = [tuple(rollout.infos[b][-1]["answers"].values()) for b in block]  # last step, per graded role
            answers = [None if any(a is None for a in ans) else ans for ans in answers]  # one not judged: no vote
            total += majority_vote(answers, [rollout.solved[b] for b in block], same)
    return total / (num_problems * blocks)


def same_answer(grader: Grader) -> Callable[[tuple, tuple], bool]:
    """Whether two episode answers are one: per graded role, equal text or the first, as gold, verifies the second."""
    def verifies(gold: str, answer: str) -> bool:
        try:
            return grader.grade(gold, f"\\boxed{{{answer}}}") == CORRECT
        except ValueError:  # the first does not parse as a gold answer: only equal text is the same
            return False
    return lambda a, b: all(x == y or verifies(x, y) for x, y in zip(a, b))


def solved_counts(rollout: Rollout, num_problems: int) -> list[int]:
    """c_p: solved samples of each problem, when episode b played problem b mod P."""
    return [sum(rollout.solved[p::num_problems]) for p in range(num_problems)]


@torch.no_grad()
def heldout_metrics(generate_actions: GenerateActions, tokenizer, org: Organisation, problems: list[Problem],
                    grader: Grader, cfg: Config, greedy_only: bool = False,
                    top_p: float = 1.0) -> tuple[dict, Rollout | None, Rollout | None]:
    """(metrics, sampled rollout or None, greedy rollout or None) of the current policies: P problems ×
    k = cfg.eval_samples episodes (b on problem b mod P, noise re-seeded from cfg.seed; none if `greedy_only` or k = 0),
    c_p solved on problem p: eval/accuracy = mean_p c_p / k (pass@1), eval/pass@k = mean_p 1 − C(k − c_p, k) / C(k, k),
    eval/maj@k = mean_p [majority answer right]; then (cfg.eval_greedy) one greedy episode per problem."""
    metrics, sampled, greedy_rollout = {}, None, None
    if cfg.eval_samples and not (greedy_only and cfg.eval_greedy):
        samples = cfg.eval_samples
        torch.manual_seed(cfg.seed + 424242)
        sampled = run_episodes(generate_actions, tokenizer, org, problems * samples, grader,
                               generation.Sampling.of(cfg, top_p), cfg)
        counts = solved_counts(sampled, len(problems))
        metrics["eval/accuracy"] = sum(c / samples for c in counts) / len(problems)  # pass@1
        metrics["eval/unparseable_rate"] = sampled.unparseable / max(sampled.graded_answers, 1)
        metrics |= task_metrics(sampled, cfg, "eval") | tool_metrics(sampled, org, "eval")  # the task's own, the tools'
        if samples > 1:
            metrics[f"eval/pass@{samples}"] = sum(pass_at_k(samples, c, samples) for c in counts) / len(problems)
            if has_answers(sampled):
                metrics[f"eval/maj@{samples}"] = maj_at_k(sampled, len(problems), samples, same_answer(grader))
        metrics["eval/generated_tokens_per_episode"] = sum(map(len, sampled.response_ids)) / len(sampled.solved)
    if cfg.eval_greedy:
        greedy_rollout = run_episodes(generate_actions, tokenizer, org, problems, grader,
                                      generation.Sampling(0.0, 1.0, cfg.max_new_tokens), cfg)
        metrics["eval/accuracy_greedy"] = sum(greedy_rollout.solved) / len(problems)
        metrics["eval/greedy/generated_tokens_per_episode"] = sum(map(len, greedy_rollout.response_ids)) / len(problems)
        metrics |= task_metrics(greedy_rollout, cfg, "eval/greedy") | tool_metrics(greedy_rollout, org, "eval/greedy")
    # The realised D_t (orchestrated only) of the greedy episodes, which every evaluation plays, else the sampled.
    metrics |= orchestration_metrics(greedy_rollout or sampled, org, prefix="eval")
    return metrics, sampled, greedy_rollout
