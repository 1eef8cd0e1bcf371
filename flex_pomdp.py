"""Flex-POMDP: agent profiles, the dependency function D, unrolled observations, and the critic's input.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "Flex-POMDP". README: "Paper ↔ code".

A LaMAS is modelled as the tuple ⟨V, N, S, O, A, T, R, γ, D⟩. This module owns *who sees what*:

  N   the agents, each an `AgentProfile` (role, system prompt, whether its answer is graded,
      optional worked examples shown before the question);
  D   the dependency function, D(a^i, a^j) ∈ {0, 1}: 1 means agent j's action at step t is
      conditioned on agent i's action at the same step. Within a step D must be a DAG; agents act
      in a topological order σ. A cycle is a configuration error.
  ô   the unrolled observation (the paper's key construction):

          ô^j_t = o^j_t ⊕ { a^i_t : D(a^i, a^j) = 1 }                                  (Flex-POMDP)

      agent j's prompt is its own observation followed by the actions it depends on, in σ
      order, each tagged by the acting agent's role. o^j_t is one text every agent reads, or one
      per agent where the environment gives each its own (`own_observation`).
  V   the centralised critic's input (`critic_messages`): D decides what a *policy* reads, not
      what the critic reads. The value of the k-th action of step t reads

          V_{t,k} = V_φ(o_t ⊕ a_{t,<k})        (a_{t,<k}: the step's actions before the k-th, in σ order;
                                               o_t: every agent's o^j_t, each tagged by its role, `joint_observation`)

      because the multi-agent advantage decomposition
      A(o, a^{i_1:N}) = Σ_m A^{i_m}(o, a^{i_1:m−1}, a^{i_m}) conditions agent i_m's advantage on
      every action before it: δ_{t,k} = r_{t,k} + γ_a V_{t,k+1} − V_{t,k} says something about
      action k only when V_{t,k+1} has seen it.

Examples of D:
  chain      D(a^i, a^j) = 1 for all i < j in σ (planner → solver → verifier): the critic's input
             is exactly the policy's prompt (`Organisation.reads_every_earlier_action`);
  parallel   D ≡ 0, a Dec-POMDP of independent agents: the critic of solver_b reads solver_a's
             action, which solver_b's policy never sees;
  dynamic    (the paper lets D change with t) an orchestrator ends each response with one decision
             (`parse_decision`): `\\call{role}` (that executor acts next) or `\\call{finish}`. A step
             is a sequence of varying length, orchestrator, executor, …, orchestrator, whose realised D_t
             is "each action reads all earlier actions of the step"; a fixed D is the case where it is σ.

`load_organisation` reads a profile JSON file; the built-in organisations are the files organisations/<name>.json.
A file is {"agents": [{"role", "system_prompt", "graded", "examples", "rewards"}, …], "dependencies": [[i, j], …]},
the pairs with D(a^i, a^j) = 1 ("j reads i"; [] is D ≡ 0); a dynamic D gives "orchestrator" and "max_calls"
instead (every rule: docs/organisations.md). This file imports nothing of ours and no torch.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path


@dataclass(frozen=True)
class AgentProfile:
    """One agent i ∈ N: what it is told, and whether the environment grades its answer."""
    role: str
    system_prompt: str
    graded: bool = False
    # Worked examples (user, assistant) shown as earlier chat turns, laid out as `unrolled_user_text`.
    examples: tuple[tuple[str, str], ...] = ()
    # Per-role reward terms (term name, weight) added to its placed team reward (envs.ROLE_REWARD_TERMS).
    rewards: tuple[tuple[str, float], ...] = ()
    # What an orchestrator is told about this executor (one line; orchestrated organisations only).
    description: str = ""
    # A tool (tools.py: a fixed policy, no adapter, no PPO sample): its name, "" for a learning agent.
    tool: str = ""


@dataclass(frozen=True)
class Organisation:
    """The agents N and the dependency function D, with σ precomputed and validated. With an
    orchestrator there is no fixed D: `order` is the orchestrator, then the executors as listed."""
    agents: tuple[AgentProfile, ...]
    dependencies: frozenset[tuple[str, str]]  # {(i, j) : D(a^i, a^j) = 1}
    order: tuple[str, ...]  # σ, a topological order of D
    orchestrator: str | None = None
    max_calls: int = 0  # executor calls per step (orchestrated only)

    @property
    def executors(self) -> tuple[str, ...]:
        """The roles an orchestrator may call (every role of a fixed-D organisation)."""
        return tuple(r for r in self.order if r != self.orchestrator)

    @property
    def roles(self) -> tuple[str, ...]:
        return self.order

    @property
    def graded_roles(self) -> tuple[str, ...]:
        return tuple(r for r in self.order if self.profile(r).graded)

    def profile(self, role: str) -> AgentProfile:
        for agent in self.agents:
            if agent.role == role:
                return agent
        raise KeyError(f"no agent with role {role!r}; roles are {list(self.order)}")

    @property
    def learners(self) -> tuple[str, ...]:
        """The agents that learn (every one but the tools), in σ order: one adapter each."""
        return tuple(role for role in self.order if not self.profile(role).tool)

    def parents(self, role: str) -> tuple[str, ...]:
        """{i : D(a^i, a^role) = 1}, in σ order."""
        return tuple(r for r in self.order if (r, role) in self.dependencies)

    def reads_every_earlier_action(self, role: str) -> bool:
        """Whether `role`'s prompt holds every earlier action of its step, so that the critic's input is
        its policy's prompt: always with an orchestrator, under a fixed D when it reads all before it."""
        return self.orchestrator is not None or self.parents(role) == self.order[: self.order.index(role)]


def topological_order(roles: list[str], dependencies: set[tuple[str, str]]) -> tuple[str, ...]:
    """σ: a topological order of the DAG D (Kahn's algorithm, ties broken by listing order); a
    ValueError names the agents on a cycle."""
    remaining = list(roles)
    placed: list[str] = []
    while remaining:
        ready = [r for r in remaining if all(i in placed for (i, j) in dependencies if j == r)]
        if not ready:
            # Agents merely downstream of a cycle are stuck too; peel them off to name only the cycle.
            on_cycle = set(remaining)
            while True:
                downstream = {r for r in on_cycle if not any(i == r and j in on_cycle for (i, j) in dependencies)}
                if not downstream:
                    break
                on_cycle -= downstream
            raise ValueError(f"the dependency graph D has a cycle among agents {sorted(on_cycle)}: within one step D "
                             "must be acyclic (a DAG). Remove one of the dependencies between these agents.")
        placed.append(ready[0])
        remaining.remove(ready[0])
    return tuple(placed)


def make_organisation(agents: list[AgentProfile], dependencies: list[tuple[str, str]]) -> Organisation:
    """Validate the agents and D, then compute σ. Every configuration error is a ValueError."""
    roles = [a.role for a in agents]
    if not agents:
        raise ValueError("the organisation has no agents: list at least one agent profile")
    duplicates = sorted({r for r in roles if roles.count(r) > 1})
    if duplicates:
        raise ValueError(f"duplicate agent role(s) {duplicates}: every agent needs a unique role name")
    for role in roles:
        if not role or not role.replace("_", "").isalnum():
            raise ValueError(f"agent role {role!r} must be a non-empty name of letters, digits and _")
    edges = set()
    for edge in dependencies:
        if len(edge) != 2:
            raise ValueError(f"dependency {edge!r} must be a pair [from_role, to_role]")
        i, j = edge
        for r in (i, j):
            if r not in roles:
                raise ValueError(f"dependency {[i, j]} names unknown role {r!r}; known roles are {roles}")
        if i == j:
            raise ValueError(f"dependency {[i, j]}: an agent cannot depend on its own action in the same step")
        edges.add((i, j))
    if not any(a.graded for a in agents):
        raise ValueError(f"no agent is graded: mark at least one of {roles} with \"graded\": true "
                         "(the environment rewards the graded agents' answers)")
    order = topological_order(roles, edges)
    return Organisation(agents=tuple(agents), dependencies=frozenset(edges), order=order)


def make_orchestrated(agents: list[AgentProfile], orchestrator: str, max_calls: int,
                      dependencies: list[tuple[str, str]] = ()) -> Organisation:
    """An organisation whose D the orchestrator decides step by step (module docstring)."""
    roles = [a.role for a in agents]
    if orchestrator not in roles:
        raise ValueError(f"orchestrator {orchestrator!r} is not one of the agents {roles}")
    if list(dependencies):
        raise ValueError("an orchestrated organisation has no fixed dependencies: the orchestrator decides who acts "
                         "and every executor reads all earlier actions of the step; leave 'dependencies' out")
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        raise ValueError(f"max_calls={max_calls!r}: give the most executor calls per step, an integer ≥ 1")
    if FINISH in roles or TEAM_ANSWER in roles:
        raise ValueError(f"no agent of an orchestrated organisation may be called {FINISH!r} (\\call{{{FINISH}}} is the "
                         f"orchestrator's finish decision) or {TEAM_ANSWER!r} (the name of the team's answer)")
    if len(agents) < 2:
        raise ValueError("an orchestrated organisation needs the orchestrator and at least one executor")
    head = next(a for a in agents if a.role == orchestrator)
    if head.tool:
        raise ValueError(f"the orchestrator {orchestrator!r} cannot be a tool: it decides, and only a learning agent does")
    if head.graded:
        raise ValueError(f"the orchestrator {orchestrator!r} cannot be graded: the team's answer is a graded executor's")
    executors = [a for a in agents if a.role != orchestrator]
    undescribed = [a.role for a in executors if not a.description.strip()]
    if undescribed:
        raise ValueError(f"executor(s) {undescribed} need a one-line 'description': it is what the orchestrator is told about them")
    # Everything else (names, duplicates, a graded executor) is checked as for a fixed D ≡ 0.
    return replace(make_organisation(agents, []), order=(orchestrator, *[a.role for a in executors]),
                   orchestrator=orchestrator, max_calls=max_calls)


# --- The orchestrator's decision: \call{role} or \call{finish} ---

FINISH = "finish"
TEAM_ANSWER = "answer"  # the environment's name for the step's answer: the last graded executor's action
DECISION = re.compile(r"\\call\{([^{}]*)\}")


@dataclass(frozen=True)
class Decision:
    """What an orchestrator's action decides: call `role`, finish, or an error (`error` says why)."""
    kind: str  # "call" | "finish" | "error"
    role: str | None = None
    error: str | None = None


def parse_decision(text: str, executors: tuple[str, ...]) -> Decision:
    """The one decision an orchestrator's response must contain: `\\call{role}` or `\\call{finish}`.
    None, two or more, or a role that is no executor (matched exactly, spaces stripped) are errors."""
    found = [name.strip() for name in DECISION.findall(text)]
    if not found:
        return Decision("error", error="no decision")
    if len(found) > 1:
        return Decision("error", error=f"{len(found)} decisions")
    name = found[0]
    if name == FINISH:
        return Decision("finish")
    if name in executors:
        return Decision("call", role=name)
    return Decision("error", error=f"unknown role {name!r}")


# --- Observations: o^j_t, each agent's own, and o_t, what the centralised critic reads ---

def own_observation(observation: str | dict[str, str], role: str) -> str:
    """o^j_t: one text every agent reads, or (an environment that gives each agent its own view) role → text."""
    return observation[role] if isinstance(observation, dict) else observation


def joint_observation(org: Organisation, observation: str | dict[str, str]) -> str:
    """o_t for the critic: the one text, or every agent's own o^j_t in σ order, each tagged by its role."""
    if not isinstance(observation, dict):
        return observation
    return "\n\n".join(f"{role.capitalize()} reads: {observation[role].strip()}" for role in org.order if role in observation)


# --- The unrolled observation ô^j_t = o^j_t ⊕ {a^i_t : D(a^i, a^j) = 1} ---

def unrolled_user_text(observation: str, dependency_actions: list[tuple[str, str]]) -> str:
    """The user turn of ô^j: the observation, then each depended-on action tagged by its role."""
    return "\n\n".join([f"Problem: {observation.strip()}"]
                       + [f"{role.capitalize()}: {action.strip()}" for role, action in dependency_actions])


def unrolled_messages(org: Organisation, role: str, observation: str, step_actions: dict[str, str]) -> list[dict]:
    """Chat messages agent `role` sees at this step under a fixed D: system prompt, worked examples, then
    ô^j_t; `step_actions` (role → text) holds every parent's action whenever agents act in σ order."""
    missing = [p for p in org.parents(role) if p not in step_actions]
    if missing:
        raise ValueError(f"agent {role!r} depends on {missing}, which have not acted yet in this step")
    return chat_messages(org, role, unrolled_user_text(observation, [(p, step_actions[p]) for p in org.parents(role)]))


def critic_messages(org: Organisation, role: str, observation: str, transcript: list[tuple[str, str]]) -> list[dict]:
    """The centralised critic's input for the action `role` takes next: its system prompt and worked
    examples, then o_t ⊕ every earlier action of the step (`transcript`, (role, text) in the order
    taken), whatever D lets the policy read; the policy's prompt where `reads_every_earlier_action`."""
    return chat_messages(org, role, unrolled_user_text(observation, transcript))


# With an orchestrator the policy reads the same: ô = o_t ⊕ every earlier action of the step (the realised D_t).
realised_messages = critic_messages


def chat_messages(org: Organisation, role: str, user_text: str) -> list[dict]:
    """System prompt (the orchestrator's lists its team and the decision format), worked examples, then ô."""
    profile = org.profile(role)
    system = profile.system_prompt
    if role == org.orchestrator:  # its own prompt, then its team (role: description) and the decision format
        members = "\n".join(f"- {member}: {org.profile(member).description}" for member in org.executors)
        system = (f"{system}\n\nTeam members:\n{members}\n\nEnd your reply with exactly one decision: "
                  f"\\call{{ROLE}} to let that member act next, or \\call{{{FINISH}}} when the team's answer is "
                  f"final. You may call members at most {org.max_calls} times.")
    messages = [{"role": "system", "content": system}]
    for user, assistant in profile.examples:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": user_text})
    return messages


# --- The profile file, and the built-in organisations: the profile files in organisations/ ---

ORGANISATIONS_DIR = Path(__file__).resolve().parent / "organisations"
# In the order error messages list them; the last three are the code task's (their prompts ask for programs).
BUILTIN_NAMES = ("single", "chain", "chain3", "chain4", "parallel", "orchestrated", "calculator_team",
                 "orchestrated_calculator", "coder", "planner_coder", "coder_reviewer")
CODE_ORGANISATIONS = ("coder", "planner_coder", "coder_reviewer")


def organisation_from_dict(spec: dict, where: str) -> Organisation:
    """Parse the profile-file format (see the module docstring); `where` names the source in errors."""
    orchestrated = isinstance(spec, dict) and "orchestrator" in spec
    required = {"agents", "orchestrator", "max_calls"} if orchestrated else {"agents", "dependencies"}
    if not isinstance(spec, dict) or not required <= set(spec) <= required | {"dependencies"}:
        raise ValueError(f"{where}: a profile file is a JSON object with the keys 'agents' and 'dependencies' (an empty "
                         "dependency list means D ≡ 0), or, for a dynamic D, 'agents', 'orchestrator' and 'max_calls'")
    agents = []
    for k, entry in enumerate(spec["agents"]):
        here = f"{where}: agents[{k}]"
        if isinstance(entry, dict) and "tool" in entry:  # a tool (tools.TOOLS): no prompt, examples, rewards or grade
            unknown = set(entry) - {"role", "tool", "description"}
            if unknown:
                raise ValueError(f"{here} is a tool: it takes only 'role', 'tool' and 'description', "
                                 f"not {sorted(unknown)}")
            if not isinstance(entry["tool"], str) or not entry["tool"]:
                raise ValueError(f"{here}.tool names a tool, e.g. \"calculator\"")
            if not isinstance(entry.get("description", ""), str):
                raise ValueError(f"{here}.description is one line of text")
            agents.append(AgentProfile(str(entry.get("role", "")), "", tool=entry["tool"],
                                       description=entry.get("description", "")))
            continue
        if not isinstance(entry, dict) or "role" not in entry or "system_prompt" not in entry:
            raise ValueError(f"{here} needs at least 'role' and 'system_prompt' (or 'role' and 'tool')")
        unknown = set(entry) - {"role", "system_prompt", "graded", "examples", "rewards", "description"}
        if unknown:
            raise ValueError(f"{here} has unknown key(s) {sorted(unknown)}")
        if not isinstance(entry.get("graded", False), bool):
            raise ValueError(f"{here}.graded must be true or false (a JSON boolean)")
        examples = []
        for e in entry.get("examples", []):
            if not isinstance(e, dict) or set(e) != {"user", "assistant"}:
                raise ValueError(f"{here}.examples entries are objects {{'user': ..., 'assistant': ...}}")
            examples.append((e["user"], e["assistant"]))
        rewards = entry.get("rewards", {})
        if not isinstance(rewards, dict) or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in rewards.values()):
            raise ValueError(f"{here}.rewards is an object {{term name: weight (a number)}}")
        if not isinstance(entry.get("description", ""), str):
            raise ValueError(f"{here}.description is one line of text")
        agents.append(AgentProfile(entry["role"], entry["system_prompt"], bool(entry.get("graded", False)), tuple(examples),
                                   tuple((name, float(w)) for name, w in rewards.items()), entry.get("description", "")))
    dependencies = [tuple(d) for d in spec.get("dependencies", [])]
    if orchestrated:
        return make_orchestrated(agents, spec["orchestrator"], spec["max_calls"], dependencies)
    return make_organisation(agents, dependencies)


def load_organisation(name_or_path: str) -> Organisation:
    """A built-in organisation by name (organisations/<name>.json), or a profile JSON file."""
    if name_or_path in BUILTIN_ORGANISATIONS:
        return BUILTIN_ORGANISATIONS[name_or_path]()
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"agents={name_or_path!r} is neither a built-in organisation "
                         f"({', '.join(BUILTIN_ORGANISATIONS)}) nor an existing profile JSON file")
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    return organisation_from_dict(spec, str(path))


BUILTIN_ORGANISATIONS = {name: partial(load_organisation, str(ORGANISATIONS_DIR / f"{name}.json")) for name in BUILTIN_NAMES}
