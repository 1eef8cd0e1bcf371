"""Flex-POMDP: agent profiles, the dependency function D, and unrolled observations.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "Flex-POMDP". README: "Paper ↔ code".

A LaMAS is modelled as the tuple ⟨V, N, S, O, A, T, R, γ, D⟩. This module owns the parts that
are about *who sees what*:

  N   the agents, each an `AgentProfile` (role name, system prompt, whether its answer is graded,
      optional worked examples shown before the question);
  D   the dependency function, D(a^i, a^j) ∈ {0, 1}: 1 means agent j's action at step t is
      conditioned on agent i's action at the same step. Within a step D must be a DAG; agents act
      in a topological order σ. A cycle is a configuration error.
  ô   the unrolled observation (the paper's key construction):

          ô^j_t = o^j_t ⊕ { a^i_t : D(a^i, a^j) = 1 }                                  (Flex-POMDP)

      agent j's prompt is its own observation followed by the actions it depends on, in σ
      order, each tagged by the acting agent's role.

Special cases: the *chain* (D(a^i, a^j) = 1 for all i < j: planner → solver → verifier) and
D ≡ 0 (`parallel`, a Dec-POMDP of independent agents). This file imports nothing of ours and no
torch: it is plain data and graph code.

Deviation from the paper: D here is fixed for the whole episode (the paper also allows D to
change with t, e.g. an orchestrator choosing executors). A fork that needs a dynamic D makes
`Organisation` a function of t; every consumer only calls `order` and `unrolled_messages`.

Profile file format (JSON), used by `load_organisation`:

    {"agents": [
        {"role": "planner", "system_prompt": "...", "graded": false,
         "examples": [{"user": "...", "assistant": "..."}], "rewards": {"no_boxed": 0.1}},
        {"role": "solver", "system_prompt": "...", "graded": true}],
     "dependencies": [["planner", "solver"]]}

`dependencies` lists the pairs (i, j) with D(a^i, a^j) = 1 ("j reads i"); an empty list is D ≡ 0.
`rewards` (optional) names per-role reward terms and their weights (README: Advantages and credit).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AgentProfile:
    """One agent i ∈ N: what it is told, and whether the environment grades its answer."""

    role: str
    system_prompt: str
    graded: bool = False
    # Worked examples (user, assistant) shown as earlier chat turns: the observation function's
    # fixed context. The user side must use the same layout as `unrolled_user_text`.
    examples: tuple[tuple[str, str], ...] = ()
    # Per-role reward terms (term name, weight), added to this agent's placed team reward at every
    # step it acts; the environment defines the terms (envs.ROLE_REWARD_TERMS).
    rewards: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Organisation:
    """The agents N and the dependency function D, with σ precomputed and validated."""

    agents: tuple[AgentProfile, ...]
    dependencies: frozenset[tuple[str, str]]  # {(i, j) : D(a^i, a^j) = 1}
    order: tuple[str, ...]  # σ, a topological order of D

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

    def parents(self, role: str) -> tuple[str, ...]:
        """{i : D(a^i, a^role) = 1}, in σ order."""
        return tuple(r for r in self.order if (r, role) in self.dependencies)


def topological_order(roles: list[str], dependencies: set[tuple[str, str]]) -> tuple[str, ...]:
    """σ: a topological order of the DAG D (Kahn's algorithm, ties broken by listing order).

    Raises ValueError naming the agents on a cycle.
    """
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
            raise ValueError(
                "the dependency graph D has a cycle among agents "
                f"{sorted(on_cycle)}: within one step D must be acyclic (a DAG). "
                "Remove one of the dependencies between these agents."
            )
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
        raise ValueError(
            f"no agent is graded: mark at least one of {roles} with \"graded\": true "
            "(the environment rewards the graded agents' answers)"
        )
    order = topological_order(roles, edges)
    return Organisation(agents=tuple(agents), dependencies=frozenset(edges), order=order)


# ---------------------------------------------------------------------------------------------
# The unrolled observation ô^j_t = o^j_t ⊕ {a^i_t : D(a^i, a^j) = 1}
# ---------------------------------------------------------------------------------------------

def unrolled_user_text(observation: str, dependency_actions: list[tuple[str, str]]) -> str:
    """The user turn of ô^j: the observation, then each depended-on action tagged by its role."""
    parts = [f"Problem: {observation.strip()}"]
    for role, action in dependency_actions:
        parts.append(f"{role.capitalize()}: {action.strip()}")
    return "\n\n".join(parts)


def unrolled_messages(org: Organisation, role: str, observation: str, step_actions: dict[str, str]) -> list[dict]:
    """Chat messages agent `role` sees at this step: system prompt, worked examples, then ô^j_t.

    `step_actions` holds the actions already taken at this step (role → text); every parent of
    `role` under D must be among them, which holds whenever agents act in σ order.
    """
    profile = org.profile(role)
    missing = [p for p in org.parents(role) if p not in step_actions]
    if missing:
        raise ValueError(f"agent {role!r} depends on {missing}, which have not acted yet in this step")
    messages = [{"role": "system", "content": profile.system_prompt}]
    for user, assistant in profile.examples:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    dependency_actions = [(p, step_actions[p]) for p in org.parents(role)]
    messages.append({"role": "user", "content": unrolled_user_text(observation, dependency_actions)})
    return messages


# ---------------------------------------------------------------------------------------------
# Built-in organisations and the profile file
# ---------------------------------------------------------------------------------------------

# Every built-in agent sees one worked example, laid out exactly like its real prompt: the example
# problem followed by the example lines of the agents it depends on under D.
_EXAMPLE_PROBLEM = "What is 2 + 3?"
_EXAMPLE_ACTIONS = {
    "analyst": "We need the sum of 2 and 3.",
    "planner": "Add the two numbers 2 and 3.",
    "solver": "2 + 3 = 5. The answer is \\boxed{5}.",
    "verifier": "The solver is right: 2 + 3 = 5. The answer is \\boxed{5}.",
}
_SYSTEM_PROMPTS = {
    "analyst": "You are the analyst of a team. Restate the problem in one short sentence, naming its numbers.",
    "planner": (
        "You are the planner of a team. Read the problem and write one short sentence that says "
        "which operation to do on which numbers. Do not compute the result."
    ),
    "solver": (
        "You are the solver of a team. Follow the planner's note, compute the result, and end with "
        "the final answer as \\boxed{N}."
    ),
    "verifier": (
        "You are the verifier of a team. Check the solver's computation. If it is right, repeat its "
        "answer; if it is wrong, correct it. End with the final answer as \\boxed{N}."
    ),
    "lone_solver": "You are a math solver. Compute the result and end with the final answer as \\boxed{N}.",
}


def _builtin(agents: list[tuple[str, str, bool]], dependencies: list[tuple[str, str]]) -> Organisation:
    """Build an organisation from (role, kind, graded) triples; `kind` picks prompt and example line."""
    profiles = []
    for role, kind, graded in agents:
        parents = [(other, _EXAMPLE_ACTIONS[other_kind]) for other, other_kind, _ in agents if (other, role) in dependencies]
        example_reply = _EXAMPLE_ACTIONS["solver" if kind == "lone_solver" else kind]
        example = (unrolled_user_text(_EXAMPLE_PROBLEM, parents), example_reply)
        profiles.append(AgentProfile(role, _SYSTEM_PROMPTS[kind], graded, (example,)))
    return make_organisation(profiles, dependencies)


def _chain(kinds: list[str], graded: str) -> Organisation:
    """The chain: D(a^i, a^j) = 1 for every i < j (each agent reads all earlier ones)."""
    edges = [(kinds[i], kinds[j]) for i in range(len(kinds)) for j in range(i + 1, len(kinds))]
    return _builtin([(k, k, k == graded) for k in kinds], edges)


BUILTIN_ORGANISATIONS = {
    "single": lambda: _builtin([("solver", "lone_solver", True)], []),
    "chain": lambda: _chain(["planner", "solver"], graded="solver"),
    # In a trio or quartet the verifier gives the team's answer; the solver is not graded itself.
    "chain3": lambda: _chain(["planner", "solver", "verifier"], graded="verifier"),
    "chain4": lambda: _chain(["analyst", "planner", "solver", "verifier"], graded="verifier"),
    # D ≡ 0: two independent solvers, both graded (the reward is their mean).
    "parallel": lambda: _builtin([("solver_a", "lone_solver", True), ("solver_b", "lone_solver", True)], []),
}


def organisation_from_dict(spec: dict, where: str) -> Organisation:
    """Parse the profile-file format (see the module docstring); `where` names the source in errors."""
    if not isinstance(spec, dict) or set(spec) != {"agents", "dependencies"}:
        raise ValueError(f"{where}: a profile file is a JSON object with exactly the keys 'agents' and 'dependencies' "
                         "(an empty dependency list means D ≡ 0)")
    agents = []
    for k, entry in enumerate(spec["agents"]):
        if not isinstance(entry, dict) or "role" not in entry or "system_prompt" not in entry:
            raise ValueError(f"{where}: agents[{k}] needs at least 'role' and 'system_prompt'")
        unknown = set(entry) - {"role", "system_prompt", "graded", "examples", "rewards"}
        if unknown:
            raise ValueError(f"{where}: agents[{k}] has unknown key(s) {sorted(unknown)}")
        if not isinstance(entry.get("graded", False), bool):
            raise ValueError(f"{where}: agents[{k}].graded must be true or false (a JSON boolean)")
        examples = []
        for e in entry.get("examples", []):
            if not isinstance(e, dict) or set(e) != {"user", "assistant"}:
                raise ValueError(f"{where}: agents[{k}].examples entries are objects {{'user': ..., 'assistant': ...}}")
            examples.append((e["user"], e["assistant"]))
        rewards = entry.get("rewards", {})
        if not isinstance(rewards, dict) or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in rewards.values()):
            raise ValueError(f"{where}: agents[{k}].rewards is an object {{term name: weight (a number)}}")
        agents.append(AgentProfile(entry["role"], entry["system_prompt"], bool(entry.get("graded", False)), tuple(examples),
                                   tuple((name, float(w)) for name, w in rewards.items())))
    return make_organisation(agents, [tuple(d) for d in spec["dependencies"]])


def load_organisation(name_or_path: str) -> Organisation:
    """A built-in organisation by name, or a profile JSON file."""
    if name_or_path in BUILTIN_ORGANISATIONS:
        return BUILTIN_ORGANISATIONS[name_or_path]()
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"agents={name_or_path!r} is neither a built-in organisation "
            f"({', '.join(BUILTIN_ORGANISATIONS)}) nor an existing profile JSON file"
        )
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    return organisation_from_dict(spec, str(path))
