"""Tests of `flex_pomdp.py` (paper Sec. "Flex-POMDP"): organisations, the dependency function D, σ, the
unrolled observation ô^j_t = o^j_t ⊕ {a^i_t : D(a^i, a^j) = 1}, and the centralised critic's input
o_t ⊕ every earlier action of the step.

Expected prompts are written out literally from the layout "Problem: <o>" followed by one
"<Role>: <action>" paragraph per depended-on agent, in σ order.
"""

import json
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

import flex_pomdp
from flex_pomdp import (
    AgentProfile,
    load_organisation,
    make_organisation,
    topological_order,
    unrolled_messages,
)


def agent(role, graded=False, examples=()):
    return AgentProfile(role, f"You are {role}.", graded, examples)


# ---------------------------------------------------------------------------------------------
# make_organisation: configuration errors
# ---------------------------------------------------------------------------------------------

def test_cycle_is_an_error_naming_the_agents_on_it():
    agents = [agent("a", graded=True), agent("b"), agent("c"), agent("d")]
    # a → b → c → a is a cycle; d is free
    with pytest.raises(ValueError, match="cycle") as err:
        make_organisation(agents, [("a", "b"), ("b", "c"), ("c", "a")])
    message = str(err.value)
    for role in ("a", "b", "c"):
        assert repr(role) in message, f"the cycle message must name {role!r}: {message}"
    assert "'d'" not in message, f"d is not on the cycle: {message}"


def test_cycle_message_does_not_blame_agents_downstream_of_the_cycle():
    # b ⇄ c is the cycle; d only reads c (downstream, not on the cycle). The docstring of
    # topological_order promises "ValueError naming the agents on a cycle", and the message tells
    # the user to "remove one of the dependencies between these agents": removing c → d would
    # not help, so d must not be listed.
    agents = [agent("a", graded=True), agent("b"), agent("c"), agent("d")]
    with pytest.raises(ValueError, match="cycle") as err:
        make_organisation(agents, [("a", "b"), ("b", "c"), ("c", "b"), ("c", "d")])
    message = str(err.value)
    assert "'b'" in message and "'c'" in message, message
    assert "'d'" not in message, (
        "BUG (flex_pomdp.topological_order): the cycle error lists every agent Kahn's algorithm could "
        f"not place, including 'd' which is only downstream of the cycle b ⇄ c: {message}"
    )


def test_unknown_role_in_dependency_is_an_error():
    with pytest.raises(ValueError, match="unknown role 'critic'"):
        make_organisation([agent("a", graded=True), agent("b")], [("a", "b"), ("critic", "b")])


def test_duplicate_role_is_an_error():
    with pytest.raises(ValueError, match=r"duplicate agent role.*'a'"):
        make_organisation([agent("a", graded=True), agent("b"), agent("a")], [])


def test_self_dependency_is_an_error():
    with pytest.raises(ValueError, match="its own action"):
        make_organisation([agent("a", graded=True), agent("b")], [("b", "b")])


def test_no_graded_agent_is_an_error():
    with pytest.raises(ValueError, match="no agent is graded"):
        make_organisation([agent("a"), agent("b")], [("a", "b")])


def test_no_agents_is_an_error():
    with pytest.raises(ValueError, match="no agents"):
        make_organisation([], [])


def test_bad_role_name_is_an_error():
    with pytest.raises(ValueError, match="role"):
        make_organisation([agent("a b", graded=True)], [])


# ---------------------------------------------------------------------------------------------
# σ
# ---------------------------------------------------------------------------------------------

def test_topological_order_diamond():
    # a → b, a → c, b → d, c → d, listed in reverse so listing order alone is wrong
    edges = {("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")}
    sigma = topological_order(["d", "c", "b", "a"], edges)
    assert sorted(sigma) == ["a", "b", "c", "d"]
    for i, j in edges:
        assert sigma.index(i) < sigma.index(j), f"{i} → {j} violated by σ = {sigma}"
    # ties (b and c are both ready after a) are broken by listing order: c was listed before b
    assert sigma == ("a", "c", "b", "d")


def test_organisation_parents_in_sigma_order():
    org = make_organisation([agent("d", graded=True), agent("c"), agent("b"), agent("a")],
                            [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert org.order == ("a", "c", "b", "d")
    assert org.parents("d") == ("c", "b")
    assert org.parents("a") == ()
    assert org.graded_roles == ("d",)


# ---------------------------------------------------------------------------------------------
# Unrolled observations
# ---------------------------------------------------------------------------------------------

def test_unrolled_messages_for_the_verifier_of_a_chain():
    org = load_organisation("chain3")
    # actions given in reverse σ order: the prompt must still follow σ (planner, then solver)
    actions = {"solver": "7 * 6 = 42. The answer is \\boxed{42}.", "planner": "Multiply 7 by 6."}
    messages = unrolled_messages(org, "verifier", "  What is 7 * 6?\n", actions)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("You are the verifier of a team.")
    # the worked example, as earlier turns, in the same layout as the real question
    assert messages[1]["content"] == (
        "Problem: What is 2 + 3?\n\n"
        "Planner: Add the two numbers 2 and 3.\n\n"
        "Solver: 2 + 3 = 5. The answer is \\boxed{5}."
    )
    assert messages[2]["content"] == "The solver is right: 2 + 3 = 5. The answer is \\boxed{5}."
    assert messages[3]["content"] == (
        "Problem: What is 7 * 6?\n\n"
        "Planner: Multiply 7 by 6.\n\n"
        "Solver: 7 * 6 = 42. The answer is \\boxed{42}."
    )


def test_unrolled_messages_custom_profile_examples_and_chain():
    examples = (("Problem: 1+1?", "2"), ("Problem: 2+2?", "4"))
    org = make_organisation([agent("p"), agent("s", graded=True, examples=examples)], [("p", "s")])
    messages = unrolled_messages(org, "s", "3+3?", {"p": "add"})
    assert messages == [
        {"role": "system", "content": "You are s."},
        {"role": "user", "content": "Problem: 1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "Problem: 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Problem: 3+3?\n\nP: add"},
    ]
    # the first agent of the chain sees only its observation
    assert unrolled_messages(org, "p", "3+3?", {}) == [
        {"role": "system", "content": "You are p."},
        {"role": "user", "content": "Problem: 3+3?"},
    ]


def test_parallel_agents_do_not_see_each_other():
    org = load_organisation("parallel")
    messages = unrolled_messages(org, "solver_b", "What is 7 * 6?", {"solver_a": "SECRET-ANSWER-A"})
    assert all("SECRET-ANSWER-A" not in m["content"] for m in messages)
    assert messages[-1] == {"role": "user", "content": "Problem: What is 7 * 6?"}


def test_the_critic_reads_every_earlier_action_of_the_step_where_the_policy_reads_only_its_parents():
    # parallel (D ≡ 0): solver_b's policy reads the problem alone; V for solver_b's action reads
    # solver_a's action too, under solver_b's own system prompt and worked example.
    org = load_organisation("parallel")
    transcript = [("solver_a", "SECRET-ANSWER-A")]
    policy = unrolled_messages(org, "solver_b", "What is 7 * 6?", dict(transcript))
    value_input = flex_pomdp.critic_messages(org, "solver_b", "What is 7 * 6?", transcript)
    assert value_input[-1] == {"role": "user", "content": "Problem: What is 7 * 6?\n\nSolver_a: SECRET-ANSWER-A"}
    assert value_input[:-1] == policy[:-1]
    assert [org.reads_every_earlier_action(r) for r in org.order] == [True, False]
    # A diamond a → {c, b} → d, σ = (a, c, b, d): b reads a, d reads c and b; the critic reads every
    # earlier action in σ order (b: a and c; d: a, c and b).
    diamond = make_organisation([agent("d", graded=True), agent("c"), agent("b"), agent("a")],
                                [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    step = [("a", "x"), ("c", "y"), ("b", "z")]
    assert unrolled_messages(diamond, "b", "o", dict(step[:2]))[-1]["content"] == "Problem: o\n\nA: x"
    assert flex_pomdp.critic_messages(diamond, "b", "o", step[:2])[-1]["content"] == "Problem: o\n\nA: x\n\nC: y"
    assert unrolled_messages(diamond, "d", "o", dict(step))[-1]["content"] == "Problem: o\n\nC: y\n\nB: z"
    assert flex_pomdp.critic_messages(diamond, "d", "o", step)[-1]["content"] == "Problem: o\n\nA: x\n\nC: y\n\nB: z"
    assert [diamond.reads_every_earlier_action(r) for r in diamond.order] == [True, True, False, False]


@pytest.mark.parametrize("name", ["single", "chain", "chain3", "chain4", "planner_coder", "coder_reviewer", "orchestrated"])
def test_in_a_chain_or_an_orchestrated_step_the_critics_input_is_the_policys_prompt(name):
    org = load_organisation(name)
    transcript = []  # every earlier action of the step, in the order taken
    for role in org.order:
        assert org.reads_every_earlier_action(role)
        policy = (flex_pomdp.realised_messages(org, role, "What is 7 * 6?", transcript) if org.orchestrator
                  else unrolled_messages(org, role, "What is 7 * 6?", dict(transcript)))
        assert flex_pomdp.critic_messages(org, role, "What is 7 * 6?", transcript) == policy
        transcript.append((role, f"The action of {role}."))


def test_unrolled_messages_missing_parent_raises():
    org = load_organisation("chain3")
    with pytest.raises(ValueError, match="solver"):
        unrolled_messages(org, "verifier", "What is 7 * 6?", {"planner": "Multiply."})


# ---------------------------------------------------------------------------------------------
# Built-in organisations
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "name, order, graded",
    [
        ("single", ("solver",), ("solver",)),
        ("chain", ("planner", "solver"), ("solver",)),
        ("chain3", ("planner", "solver", "verifier"), ("verifier",)),
        ("chain4", ("analyst", "planner", "solver", "verifier"), ("verifier",)),
        ("parallel", ("solver_a", "solver_b"), ("solver_a", "solver_b")),
    ],
)
def test_builtin_organisations(name, order, graded):
    org = load_organisation(name)
    assert org.order == order
    assert org.roles == order
    assert org.graded_roles == graded
    if name == "parallel" or name == "single":
        assert org.dependencies == frozenset()  # D ≡ 0
    else:
        # the chain: D(a^i, a^j) = 1 exactly for i < j in σ
        expected = {(order[i], order[j]) for i in range(len(order)) for j in range(i + 1, len(order))}
        assert org.dependencies == expected
    for role in order:
        assert org.profile(role).system_prompt


def test_chain3_dependencies_literal():
    org = load_organisation("chain3")
    assert org.dependencies == {("planner", "solver"), ("planner", "verifier"), ("solver", "verifier")}


# ---------------------------------------------------------------------------------------------
# Profile files
# ---------------------------------------------------------------------------------------------

PROFILE = {
    "agents": [
        {"role": "planner", "system_prompt": "Plan it.", "graded": False,
         "examples": [{"user": "Problem: What is 1 + 1?", "assistant": "Add 1 and 1."}]},
        {"role": "checker", "system_prompt": "Check it.", "graded": True},
        {"role": "solver", "system_prompt": "Solve it.", "graded": True},
    ],
    # listed so that listing order (planner, checker, solver) is not a topological order
    "dependencies": [["planner", "solver"], ["solver", "checker"]],
}


def write(tmp_path, content, name="org.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_load_organisation_from_profile_file(tmp_path):
    org = load_organisation(write(tmp_path, PROFILE))
    assert org.order == ("planner", "solver", "checker")
    assert org.graded_roles == ("solver", "checker")
    assert org.dependencies == {("planner", "solver"), ("solver", "checker")}
    assert org.profile("planner").examples == (("Problem: What is 1 + 1?", "Add 1 and 1."),)
    assert org.profile("checker").graded is True
    messages = unrolled_messages(org, "checker", "What is 2 + 2?", {"planner": "Add.", "solver": "4"})
    # checker reads only the solver (D(planner, checker) = 0)
    assert messages == [
        {"role": "system", "content": "Check it."},
        {"role": "user", "content": "Problem: What is 2 + 2?\n\nSolver: 4"},
    ]


def test_profile_reward_terms_are_read_with_their_weights_and_bad_ones_named(tmp_path):
    spec = {"agents": [{"role": "planner", "system_prompt": "P", "rewards": {"no_boxed": 0.1, "correct": 1}},
                       {"role": "solver", "system_prompt": "S", "graded": True}], "dependencies": [["planner", "solver"]]}
    org = load_organisation(write(tmp_path, spec))
    assert org.profile("planner").rewards == (("no_boxed", 0.1), ("correct", 1.0)) and org.profile("solver").rewards == ()
    spec["agents"][0]["rewards"] = {"no_boxed": "a lot"}
    with pytest.raises(ValueError, match=r"agents\[0\]\.rewards"):
        load_organisation(write(tmp_path, spec))


def test_load_organisation_empty_dependencies_is_parallel(tmp_path):
    spec = {"agents": PROFILE["agents"], "dependencies": []}
    org = load_organisation(write(tmp_path, spec))
    assert org.order == ("planner", "checker", "solver")
    assert org.dependencies == frozenset()


def test_load_organisation_unknown_name(tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="neither a built-in organisation"):
        load_organisation("chain5")
    with pytest.raises(ValueError, match="nope.json"):
        load_organisation(missing)


def test_load_organisation_bad_json(tmp_path):
    with pytest.raises(ValueError, match="not valid JSON"):
        load_organisation(write(tmp_path, '{"agents": [ {"role": "a", '))


def test_load_organisation_missing_agents_key(tmp_path):
    with pytest.raises(ValueError, match="'agents'"):
        load_organisation(write(tmp_path, {"dependencies": []}))
    with pytest.raises(ValueError, match="'agents'"):
        load_organisation(write(tmp_path, [1, 2]))


def test_load_organisation_agent_missing_keys(tmp_path):
    spec = {"agents": [{"role": "a", "graded": True}], "dependencies": []}
    with pytest.raises(ValueError, match=r"agents\[0\].*system_prompt"):
        load_organisation(write(tmp_path, spec))
    spec = {"agents": [{"role": "a", "system_prompt": "x", "graded": True, "grade": True}], "dependencies": []}
    with pytest.raises(ValueError, match="unknown key"):
        load_organisation(write(tmp_path, spec))
    spec = {"agents": [{"role": "a", "system_prompt": "x", "graded": True, "examples": [{"user": "u"}]}], "dependencies": []}
    with pytest.raises(ValueError, match="examples"):
        load_organisation(write(tmp_path, spec))


def test_load_organisation_errors_name_the_file(tmp_path):
    spec = {"agents": [agent_spec for agent_spec in PROFILE["agents"]],
            "dependencies": [["planner", "solver"], ["solver", "planner"]]}
    with pytest.raises(ValueError, match="cycle"):
        load_organisation(write(tmp_path, spec))
    spec = {"agents": [{"role": "a", "graded": True}]}
    path = write(tmp_path, spec, "named_profile.json")
    with pytest.raises(ValueError, match="named_profile.json"):
        load_organisation(path)


def test_load_organisation_misspelled_top_level_key_is_an_error(tmp_path):
    # A typo in "dependencies" must not silently give D ≡ 0 (independent agents): the agent-level
    # keys are checked for typos, and the module's own error text says a profile file is an
    # object "with keys 'agents' and 'dependencies'".
    spec = {"agents": PROFILE["agents"], "dependancies": PROFILE["dependencies"]}
    path = write(tmp_path, spec)
    try:
        org = load_organisation(path)
    except ValueError:
        return
    pytest.fail(
        "BUG (flex_pomdp.organisation_from_dict): a profile with the misspelled top-level key "
        "'dependancies' loaded silently as D ≡ 0 "
        f"(order {org.order}, dependencies {set(org.dependencies)}); unknown top-level keys are not rejected"
    )
