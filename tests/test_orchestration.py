"""The dynamic dependency function: an orchestrator decides, step by step, who acts (flex_pomdp's
docstring). Tests of the decision format, the orchestrated rollout, and the advantages along
realised sequences of unequal length at both levels.

Every expected number is worked out by hand from the equations in ppo.py's docstring (the
derivations are in the comments), never by calling the code under test or re-running its loop.

The two episodes of the advantage tables (B = 2, H = 2, action level unless said otherwise):

    episode 0, step 0: orchestrator, solver, orchestrator (finish)   R = 1, done
    episode 1, step 0: orchestrator, solver (max_calls = 1 cut)      R = 0
    episode 1, step 1: orchestrator, solver (max_calls = 1 cut)      R = 1, done

so the grid [B, T, P] has P = 3 positions, of which episode 1 fills 2 per step and episode 0's
step 1 never happens. γ = 0.9 between steps, γ_a = 0.8 (ppo.gae's tables) or 1 (the trainer's)
between the actions of a step, λ = 0.5:

    δ_k = r_k + γ_next · V_next − V_k,    Â_k = δ_k + γ_next · λ · Â_{k+1}
"""
import json
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import agents
import config as config_lib
import generation
import marft
import ppo
from envs import Grader, Problem
from flex_pomdp import AgentProfile, load_organisation, make_orchestrated, parse_decision
from rollout import Rollout, orchestration_metrics, run_episodes
from scripted import ScriptedTeam

GAMMA, GAMMA_AGENT, LAM = 0.9, 0.8, 0.5
PAD_V = 100.0  # a conspicuous value where no action was taken: it must never enter a chain


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def close(actual, expected):
    torch.testing.assert_close(actual, t(expected), atol=1e-9, rtol=0, msg=lambda m: f"{m}\nactual={actual.tolist()}")


# ---------------------------------------------------------------------------------------------
# 1. The decision format
# ---------------------------------------------------------------------------------------------

EXECUTORS = ("planner", "solver", "verifier")


def test_a_valid_call_names_the_executor():
    decision = parse_decision("The solver can add these. \\call{solver}", EXECUTORS)
    assert (decision.kind, decision.role) == ("call", "solver")
    assert parse_decision("\\call{ verifier }", EXECUTORS).role == "verifier"  # spaces around the name are dropped


def test_finish():
    assert parse_decision("The answer is final. \\call{finish}", EXECUTORS).kind == "finish"


@pytest.mark.parametrize("text, why", [
    ("Let the coder write it. \\call{coder}", "unknown role 'coder'"),
    ("\\call{Solver}", "unknown role 'Solver'"),  # names match exactly
    ("\\call{solver} and then \\call{finish}", "2 decisions"),
    ("\\call{solver} \\call{solver}", "2 decisions"),
    ("The solver should act next.", "no decision"),
    ("\\call{}", "unknown role ''"),
])
def test_unknown_role_two_decisions_or_none_are_errors(text, why):
    decision = parse_decision(text, EXECUTORS)
    assert (decision.kind, decision.error) == ("error", why)


# ---------------------------------------------------------------------------------------------
# 2. The organisation: built-in, profile file, configuration errors
# ---------------------------------------------------------------------------------------------

def test_builtin_orchestrated_team():
    org = load_organisation("orchestrated")
    assert org.orchestrator == "orchestrator" and org.executors == EXECUTORS and org.max_calls == 3
    assert org.graded_roles == ("solver", "verifier") and not org.dependencies


def test_profile_file_with_an_orchestrator(tmp_path):
    spec = {"agents": [{"role": "boss", "system_prompt": "You lead."},
                       {"role": "adder", "system_prompt": "Add.", "graded": True, "description": "adds numbers"}],
            "orchestrator": "boss", "max_calls": 2}
    path = tmp_path / "team.json"
    path.write_text(json.dumps(spec))
    org = load_organisation(str(path))
    assert (org.order, org.orchestrator, org.max_calls) == (("boss", "adder"), "boss", 2)
    assert org.profile("adder").description == "adds numbers"


@pytest.mark.parametrize("change, message", [
    (dict(max_calls=0), "max_calls=0"),
    (dict(orchestrator="nobody"), "orchestrator 'nobody' is not one of the agents"),
    (dict(dependencies=[["boss", "adder"]]), "no fixed dependencies"),
])
def test_profile_file_errors_name_the_fix(tmp_path, change, message):
    spec = {"agents": [{"role": "boss", "system_prompt": "You lead."},
                       {"role": "adder", "system_prompt": "Add.", "graded": True, "description": "adds numbers"}],
            "orchestrator": "boss", "max_calls": 2} | change
    path = tmp_path / "team.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=message):
        load_organisation(str(path))


def test_orchestrated_configuration_errors():
    boss, adder = AgentProfile("boss", "You lead."), AgentProfile("adder", "Add.", True, description="adds")
    with pytest.raises(ValueError, match="need a one-line 'description'"):
        make_orchestrated([boss, AgentProfile("adder", "Add.", True)], "boss", 2)
    with pytest.raises(ValueError, match="cannot be graded"):
        make_orchestrated([AgentProfile("boss", "You lead.", True), adder], "boss", 2)
    with pytest.raises(ValueError, match="'finish'"):
        make_orchestrated([boss, AgentProfile("finish", "Add.", True, description="x")], "boss", 2)
    with pytest.raises(ValueError, match="no agent is graded"):
        make_orchestrated([boss, AgentProfile("adder", "Add.", description="adds")], "boss", 2)


# ---------------------------------------------------------------------------------------------
# 3. The orchestrated rollout, with a scripted generator (the real tokenizer, no model)
# ---------------------------------------------------------------------------------------------

# What the orchestrator of each problem says, decision after decision (its n-th action of the step).
SCRIPT = {
    "What is 1 + 1?": ["The solver can add. \\call{solver}", "Done. \\call{finish}"],
    "What is 2 + 2?": ["Plan first. \\call{planner}", "\\call{solver}", "unused"],  # max_calls = 2 cuts after the solver
    "What is 3 + 3?": ["Ask the coder. \\call{coder}"],  # unknown role: the step ends with no answer
    "What is 4 + 4?": ["\\call{solver}", "\\call{verifier} \\call{finish}"],  # two decisions: ends after the solver
}
ANSWERS = {"What is 1 + 1?": "2", "What is 2 + 2?": "4", "What is 3 + 3?": "6", "What is 4 + 4?": "8"}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(agents.embedded_tokenizer_folder())


def scripted_generator(tokenizer):
    """Answers by role and by the problem of the prompt's last user turn (the worked examples come before it)."""
    def generate(prompt_ids, adapter, sampling):
        texts = []
        for ids in prompt_ids:
            turn = tokenizer.decode(ids).rsplit("Problem: ", 1)[1]  # this step's ô: the problem, then the transcript
            problem, role = turn.split("\n", 1)[0].removesuffix("<|im_end|>"), adapter.removeprefix("policy_")
            if role == "orchestrator":
                texts.append(SCRIPT[problem][turn.count("\n\nOrchestrator: ")])  # its n-th decision of the step
            elif role == "planner":
                texts.append("Add the two numbers.")
            else:  # solver and verifier answer right
                texts.append(f"The answer is \\boxed{{{ANSWERS[problem]}}}.")
        ids = [tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for text in texts]
        return generation.Actions(ids, [[0.0] * len(x) for x in ids])
    return generate


def test_orchestrated_rollout_realised_sequences_cut_errors_and_metrics(tokenizer):
    org = make_orchestrated(list(load_organisation("orchestrated").agents), "orchestrator", max_calls=2)
    problems = [Problem(p, a, "", "") for p, a in ANSWERS.items()]
    cfg = config_lib.Config(agents="orchestrated")
    with Grader() as grader:
        rollout = run_episodes(scripted_generator(tokenizer), tokenizer, org, problems, grader,
                               generation.Sampling(1.0, 1.0, 32), cfg)
    assert rollout.calls == [[["solver"]], [["planner", "solver"]], [[]], [["solver"]]]
    assert rollout.step_ends == [["finish"], ["max_calls"], ["error: unknown role 'coder'"], ["error: 2 decisions"]]
    # Realised sequences: the roles of each episode's samples in the order taken, with positions 0, 1, 2, …
    roles = {b: [(org.order[rollout.agent_index[s]], rollout.position[s]) for s in range(len(rollout.episode))
                 if rollout.episode[s] == b] for b in range(4)}
    assert roles == {0: [("orchestrator", 0), ("solver", 1), ("orchestrator", 2)],
                     1: [("orchestrator", 0), ("planner", 1), ("orchestrator", 2), ("solver", 3)],
                     2: [("orchestrator", 0)],
                     3: [("orchestrator", 0), ("solver", 1), ("orchestrator", 2)]}
    # The team's answer is the last graded executor's: episode 2 has none (graded as it stands: 0).
    assert rollout.team_reward[:, 0].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert [o[0]["answer"] for o in rollout.outcomes] == ["correct", "correct", "unparseable", "correct"]
    # The executor reads every earlier action of the step: the solver of episode 1 saw the planner.
    solver = next(s for s in range(len(rollout.episode)) if rollout.episode[s] == 1 and rollout.position[s] == 3)
    assert tokenizer.decode(rollout.prompt_ids[solver]).endswith(
        "Problem: What is 2 + 2?\n\nOrchestrator: Plan first. \\call{planner}\n\nPlanner: Add the two numbers.\n\n"
        "Orchestrator: \\call{solver}<|im_end|>\n<|im_start|>assistant\n")
    metrics = orchestration_metrics(rollout, org)
    assert metrics == {"charts/calls_per_episode": 4 / 4, "charts/calls/planner": 1 / 4, "charts/calls/solver": 3 / 4,
                       "charts/calls/verifier": 0.0, "charts/finish_rate": 1 / 4, "charts/max_calls_rate": 1 / 4,
                       "charts/orchestration_errors": 2 / 4}
    assert orchestration_metrics(rollout, load_organisation("chain")) == {}


# ---------------------------------------------------------------------------------------------
# 4. Advantages along realised sequences (the two episodes of the module docstring)
# ---------------------------------------------------------------------------------------------

# Samples in the order taken: (episode, step, agent index in σ = orchestrator 0 / solver 1, position k).
SAMPLES = [(0, 0, 0, 0), (0, 0, 1, 1), (0, 0, 0, 2), (1, 0, 0, 0), (1, 0, 1, 1), (1, 1, 0, 0), (1, 1, 1, 1)]
VALUES = [0.5, 0.2, 0.4, 0.3, 0.6, 1.0, -0.5]  # V(ô) of each sample (action level)
TEAM = [[1.0, 0.0], [0.0, 1.0]]  # R_t; episode 0 has no step 1
DONES = [[1.0, 0.0], [0.0, 1.0]]

# Placed rewards per credit option (episode 0's step has K = 3 actions, episode 1's steps K = 2):
#   last           ep0 [0, 0, 1]            ep1 t0 [0, 0]  t1 [0, 1]
#   equal          ep0 [1/3, 1/3, 1/3]      ep1 t0 [0, 0]  t1 [0.5, 0.5]
#   shared         ep0 [1, 1, 1]            ep1 t0 [0, 0]  t1 [1, 1]
#
# With γ_a = 0.8 (ppo.gae's γ_agent; the trainer's is 1, TRAINER_ADVANTAGES below):
# Episode 0's chain: k0 (V .5) →γ_a k1 (V .2) →γ_a k2 (V .4), done.
# Episode 1's chain: k0 (V .3) →γ_a k1 (V .6) →γ(1 − done_0) = 0.9 k2 (V 1.0) →γ_a k3 (V −.5), done.
ADVANTAGES = {
    # last:   ep0 δ2 = 1 − .4 = .6; δ1 = .8·.4 − .2 = .12, Â1 = .12 + .4·.6 = .36; δ0 = .8·.2 − .5 = −.34, Â0 = −.34 + .4·.36 = −.196
    #         ep1 δ3 = 1 + .5 = 1.5; δ2 = .8·(−.5) − 1 = −1.4, Â2 = −1.4 + .4·1.5 = −.8;
    #             δ1 = .9·1 − .6 = .3, Â1 = .3 + .45·(−.8) = −.06; δ0 = .8·.6 − .3 = .18, Â0 = .18 + .4·(−.06) = .156
    "last": [-0.196, 0.36, 0.6, 0.156, -0.06, -0.8, 1.5],
    # equal:  ep0 δ2 = 1/3 − .4, Â2 = −1/15; δ1 = 1/3 + .32 − .2, Â1 = .453333 − .4/15 = .426667;
    #             δ0 = 1/3 + .16 − .5, Â0 = −.006667 + .4·.426667 = .164
    #         ep1 δ3 = .5 + .5 = 1; δ2 = .5 − .4 − 1 = −.9, Â2 = −.9 + .4 = −.5; δ1 = .3, Â1 = .3 − .225 = .075;
    #             Â0 = .18 + .4·.075 = .21
    "equal": [0.164, 0.42666666666666667, -1 / 15, 0.21, 0.075, -0.5, 1.0],
    # shared: ep0 Â2 = .6; δ1 = 1 + .32 − .2 = 1.12, Â1 = 1.12 + .24 = 1.36; δ0 = 1 + .16 − .5 = .66, Â0 = .66 + .544 = 1.204
    #         ep1 Â3 = 1.5; δ2 = 1 − .4 − 1 = −.4, Â2 = −.4 + .6 = .2; Â1 = .3 + .45·.2 = .39; Â0 = .18 + .4·.39 = .336
    "shared": [1.204, 1.36, 0.6, 0.336, 0.39, 0.2, 1.5],
}
# The trainer's (marft.compute_advantages): γ_a = 1, the agents of a step are not time steps.
# Episode 0's chain: k0 (V .5) →1 k1 (V .2) →1 k2 (V .4), done.
# Episode 1's chain: k0 (V .3) →1 k1 (V .6) →γ(1 − done_0) = 0.9 k2 (V 1.0) →1 k3 (V −.5), done.
TRAINER_ADVANTAGES = {
    # last:   ep0 δ2 = .6; δ1 = .4 − .2 = .2, Â1 = .2 + .5·.6 = .5; δ0 = .2 − .5 = −.3, Â0 = −.3 + .5·.5 = −.05
    #         ep1 δ3 = 1.5; δ2 = −.5 − 1 = −1.5, Â2 = −1.5 + .5·1.5 = −.75;
    #             δ1 = .9·1 − .6 = .3, Â1 = .3 + .45·(−.75) = −.0375; δ0 = .6 − .3 = .3, Â0 = .3 + .5·(−.0375) = .28125
    "last": [-0.05, 0.5, 0.6, 0.28125, -0.0375, -0.75, 1.5],
    # equal:  ep0 δ2 = 1/3 − .4, Â2 = −1/15; δ1 = 1/3 + .4 − .2, Â1 = .533333 − .5/15 = .5;
    #             δ0 = 1/3 + .2 − .5, Â0 = .033333 + .5·.5 = .283333
    #         ep1 δ3 = .5 + .5 = 1; δ2 = .5 − .5 − 1 = −1, Â2 = −1 + .5 = −.5; δ1 = .3, Â1 = .3 − .225 = .075;
    #             Â0 = .3 + .5·.075 = .3375
    "equal": [0.28333333333333333, 0.5, -1 / 15, 0.3375, 0.075, -0.5, 1.0],
    # shared: ep0 Â2 = .6; δ1 = 1 + .4 − .2 = 1.2, Â1 = 1.2 + .3 = 1.5; δ0 = 1 + .2 − .5 = .7, Â0 = .7 + .75 = 1.45
    #         ep1 Â3 = 1.5; δ2 = 1 − .5 − 1 = −.5, Â2 = −.5 + .75 = .25; Â1 = .3 + .45·.25 = .4125; Â0 = .3 + .5·.4125 = .50625
    "shared": [1.45, 1.5, 0.6, 0.50625, 0.4125, 0.25, 1.5],
}


def test_each_role_samples_at_its_own_temperature_and_a_greedy_evaluation_stays_greedy(tokenizer):
    """--role_temperatures orchestrator=1.5,planner=0: the backend is asked for the orchestrator's
    actions at T = 1.5, the planner's greedily, the solver's at the rollout's own T; a greedy
    rollout (T = 0) asks every agent greedily."""
    org = make_orchestrated(list(load_organisation("orchestrated").agents), "orchestrator", max_calls=2)
    problems = [Problem(p, a, "", "") for p, a in ANSWERS.items()]
    cfg = config_lib.Config(agents="orchestrated", role_temperatures="orchestrator=1.5,planner=0", frozen_agents="planner")
    scripted = scripted_generator(tokenizer)
    for rollout_t, expected in ((0.7, {"orchestrator": 1.5, "planner": 0.0, "solver": 0.7}),
                                (0.0, {"orchestrator": 0.0, "planner": 0.0, "solver": 0.0})):
        asked = {}

        def spy(prompt_ids, adapter, sampling):
            asked.setdefault(adapter.removeprefix("policy_"), set()).add(sampling.temperature)
            return scripted(prompt_ids, adapter, sampling)
        with Grader() as grader:
            run_episodes(spy, tokenizer, org, problems, grader, generation.Sampling(rollout_t, 1.0, 32), cfg)
        assert asked == {role: {t} for role, t in expected.items()}


def realised_rollout(response_lengths=None) -> Rollout:
    rollout = Rollout(team_reward=t(TEAM), dones=t(DONES), step_mask=t([[1.0, 0.0], [1.0, 1.0]]), solved=[True, True])
    for s, (b, step, agent, k) in enumerate(SAMPLES):
        length = response_lengths[s] if response_lengths else 1
        rollout.record([1], [7] * length, [0.0] * length, "", b, step, agent, k)
    return rollout


@pytest.mark.parametrize("credit", list(TRAINER_ADVANTAGES))
def test_action_level_advantages_along_realised_sequences_of_3_and_4_decisions(credit):
    org = load_organisation("orchestrated")  # orchestrator σ index 0, planner 1 (the samples' agent 1 stands for any executor)
    rollout = realised_rollout()
    old = marft.OldPolicy(logprob=torch.zeros(7, 1), values=t(VALUES).unsqueeze(-1), mask=torch.ones(7, 1),
                          token_mask=torch.ones(7, 1))
    cfg = config_lib.Config(credit=credit, gamma=GAMMA, lam=LAM)
    advantages, returns, _, _ = marft.compute_advantages(org, rollout, old, cfg)
    close(advantages[:, 0], TRAINER_ADVANTAGES[credit])
    close(returns[:, 0], [a + v for a, v in zip(TRAINER_ADVANTAGES[credit], VALUES)])


def test_token_level_advantages_along_realised_sequences():
    # Response lengths: ep0 [2, 1, 1], ep1 t0 [1, 2], t1 [1, 1]; γ_token = γ_a = 1 (the trainer's), credit last.
    # Token values: ep0 k0 [.5, .7], k1 [.2], k2 [.4]; ep1 t0 k0 [.3], k1 [.6, .1]; t1 k0 [1.0], k1 [−.5].
    # Episode 0's token chain: a(.5) →1 b(.7) →1 c(.2) →1 d(.4), r = 1 at d, done.
    #   δd = 1 − .4 = .6;  δc = .4 − .2 = .2, Âc = .2 + .5·.6 = .5;
    #   δb = .2 − .7 = −.5, Âb = −.5 + .5·.5 = −.25;  δa = .7 − .5 = .2, Âa = .2 + .5·(−.25) = .075
    # Episode 1's: e(.3) →1 f(.6) →1 g(.1) →.9 h(1.0) →1 i(−.5), r = 1 at i, done.
    #   δi = 1.5;  δh = −.5 − 1 = −1.5, Âh = −.75;  δg = .9 − .1 = .8, Âg = .8 + .45·(−.75) = .4625;
    #   δf = .1 − .6 = −.5, Âf = −.5 + .5·.4625 = −.26875;  δe = .6 − .3 = .3, Âe = .3 + .5·(−.26875) = .165625
    lengths = [2, 1, 1, 1, 2, 1, 1]
    values = [[0.5, 0.7], [0.2, PAD_V], [0.4, PAD_V], [0.3, PAD_V], [0.6, 0.1], [1.0, PAD_V], [-0.5, PAD_V]]
    mask = [[1.0] * n + [0.0] * (2 - n) for n in lengths]
    old = marft.OldPolicy(logprob=torch.zeros(7, 2), values=t(values), mask=t(mask), token_mask=t(mask))
    cfg = config_lib.Config(credit="last", gamma=GAMMA, lam=LAM, decision_unit="token")
    advantages, returns, _, _ = marft.compute_advantages(load_organisation("orchestrated"), realised_rollout(lengths), old, cfg)
    close(advantages, [[0.075, -0.25], [0.5, 0], [0.6, 0], [0.165625, 0], [-0.26875, 0.4625], [-0.75, 0], [1.5, 0]])
    close(returns * t(mask), [[0.575, 0.45], [0.7, 0], [1.0, 0], [0.465625, 0], [0.33125, 0.5625], [0.25, 0], [1.0, 0]])


def test_token_level_with_one_token_per_action_gives_the_action_level_table():
    for credit, expected in ADVANTAGES.items():
        rewards = ppo.place_team_reward(t(TEAM), realised_rollout().to_grid(torch.ones(7)), credit)  # [B, T, P]
        grid = realised_rollout().to_grid
        adv, _ = ppo.token_level_gae(rewards, grid(t(VALUES)).unsqueeze(-1), grid(torch.ones(7)).unsqueeze(-1), t(DONES),
                                     GAMMA, GAMMA_AGENT, 1.0, LAM)
        close(adv[[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1], [0, 1, 2, 0, 1, 0, 1], 0], expected)


def test_place_team_reward_over_realised_sequences():
    acted = realised_rollout().to_grid(torch.ones(7))  # [2, 2, 3]
    close(ppo.place_team_reward(t(TEAM), acted, "last"), [[[0, 0, 1], [0, 0, 0]], [[0, 0, 0], [0, 1, 0]]])
    close(ppo.place_team_reward(t(TEAM), acted, "equal"), [[[1 / 3] * 3, [0, 0, 0]], [[0, 0, 0], [0.5, 0.5, 0]]])


def test_group_advantages_score_each_agent_by_the_mean_reward_of_its_actions():
    # One problem, G = 2 (episodes 0 and 1), H = 1, credit shared; per-role reward term on the
    # solver's action of episode 0 only: +0.5 (solver 1.5 there).
    # Episode 0: orchestrator acts twice with r = 1 each → mean 1; solver r = 1.5.
    # Episode 1: orchestrator once, r = 0; solver r = 0 (wrong answer).
    # Orchestrator returns [1, 0]: mean .5, centred [.5, −.5]; solver [1.5, 0]: centred [.75, −.75].
    rollout = Rollout(team_reward=t([[1.0], [0.0]]), dones=t([[1.0], [1.0]]), step_mask=t([[1.0], [1.0]]), solved=[True, False])
    for b, agent, k in [(0, 0, 0), (0, 1, 1), (0, 0, 2), (1, 0, 0), (1, 1, 1)]:
        rollout.record([1], [7], [0.0], "", b, 0, agent, k)
    rollout.role_reward[1] = 0.5
    old = marft.OldPolicy(logprob=torch.zeros(5, 1), values=torch.zeros(5, 1), mask=torch.ones(5, 1), token_mask=torch.ones(5, 1))
    cfg = config_lib.Config(advantage="group", group_size=2, group_std=False, credit="shared")
    advantages, returns, _, stats = marft.compute_advantages(load_organisation("orchestrated"), rollout, old, cfg)
    close(advantages[:, 0], [0.5, 0.75, 0.5, -0.5, -0.75])
    assert returns is None and stats["charts/zero_signal_groups"] == 0.0


def test_group_returns_of_an_orchestrated_team_do_not_depend_on_later_routing():
    # One problem played twice (G = 2), H = 2, credit equal, γ = 0.9, G − mean (no std).
    # σ indices: orchestrator 0, planner 1, solver 2. Both episodes play the same step 0 and are
    # right at step 1 (R = [0, 1], done at step 1); only episode 0's orchestrator calls the planner again:
    #   episode 0, t0: orchestrator, planner, orchestrator                              R = 0
    #   episode 0, t1: orchestrator, planner, orchestrator, solver, orchestrator        R = 1
    #   episode 1, t0: orchestrator, planner, orchestrator                              R = 0
    #   episode 1, t1: orchestrator, solver, orchestrator                               R = 1
    # Placed rewards (equal): 0 at step 0; R / K_t at step 1: 1/5 (episode 0), 1/3 (episode 1).
    # Each agent's r^i_t is the mean over its actions of the step: the same numbers.
    # G^i_t = r^i_t + γ · (the team's return from t + 1); the team's return from step 1 is R_1 = 1:
    #   step 0: orchestrator 0 + 0.9 · 1 = 0.9, planner 0.9, in both episodes → Â = 0 (the same step, the same outcome)
    #   step 1: orchestrator 1/5 and 1/3, solver 1/5 and 1/3 → mean 4/15, Â = ∓1/15; the planner acted
    #           at step 1 in episode 0 alone → no baseline, Â = 0
    # (Summing the planner's own later rewards would give its step-0 action 0.9 · 1/5 = 0.18 in
    # episode 0 and 0 in episode 1: Â = ±0.09 for one and the same action, by whether it was called again.)
    rollout = Rollout(team_reward=t([[0.0, 1.0], [0.0, 1.0]]), dones=t([[0.0, 1.0], [0.0, 1.0]]), step_mask=torch.ones(2, 2),
                      solved=[True, True])
    steps = {(0, 0): [0, 1, 0], (0, 1): [0, 1, 0, 2, 0], (1, 0): [0, 1, 0], (1, 1): [0, 2, 0]}  # (episode, step) → agents in order
    for (b, step), sequence in steps.items():
        for k, agent in enumerate(sequence):
            rollout.record([1], [7], [0.0], "", b, step, agent, k)
    old = marft.OldPolicy(logprob=torch.zeros(14, 1), values=torch.zeros(14, 1), mask=torch.ones(14, 1), token_mask=torch.ones(14, 1))
    cfg = config_lib.Config(advantage="group", group_size=2, group_std=False, credit="equal", gamma=0.9)
    org = load_organisation("orchestrated")
    advantages, _, _, stats = marft.compute_advantages(org, rollout, old, cfg)
    n = 1 / 15
    close(advantages[:, 0], [0, 0, 0,  -n, 0, -n, -n, -n,  0, 0, 0,  n, n, n])
    assert stats["charts/zero_signal_groups"] == pytest.approx(3 / 5)  # silent: step 0's two cells, the planner's lone step-1 cell
    placed = ppo.place_team_reward(rollout.team_reward, rollout.to_grid(torch.ones(14)), "equal")
    where = (rollout.episode, rollout.step, rollout.position)
    agent_rewards, _ = marft.per_agent_mean(rollout, placed[where], len(org.order))  # [B, T, N]
    G = ppo.group_returns(agent_rewards, rollout.team_reward, 0.9)[..., :3]  # orchestrator, planner, solver
    # (A cell without an action, the solver's at step 0, is never compared: its 0 + 0.9 · 1 is unused.)
    close(G, [[[0.9, 0.9, 0.9], [0.2, 0.2, 0.2]], [[0.9, 0.9, 0.9], [1 / 3, 0.0, 1 / 3]]])


def test_happo_factor_of_an_agent_that_acts_twice_is_the_product_of_its_ratios():
    # Episode 0's orchestrator acted at positions 0 and 2 with log-ratios log 1.5 and log 1.2 →
    # ρ = 1.8 for the joint action (0, 0), clipped to c = 2 → 1.8. Episode 1's orchestrator: log 3
    # at step 0 → clipped to 2; log 0.25 at step 1 → clipped to 1/2.
    import math
    rollout = realised_rollout()
    samples = torch.tensor([0, 2, 3, 5])  # the orchestrator's actions
    old = marft.OldPolicy(logprob=torch.zeros(7, 1), values=torch.zeros(7, 1), mask=torch.ones(7, 1), token_mask=torch.ones(7, 1))
    new_logprob = torch.tensor([[math.log(1.5)], [math.log(1.2)], [math.log(3.0)], [math.log(0.25)]])
    cfg = config_lib.Config(happo_ratio_clip=2.0, action_logprob="sum")
    M = marft.happo_weight_after_update(rollout, old, samples, new_logprob, torch.ones(2, 2), cfg)
    torch.testing.assert_close(M, torch.tensor([[1.8, 1.0], [2.0, 0.5]]))


# ---------------------------------------------------------------------------------------------
# 5. The whole loop on a tiny model: both estimators, resume, evaluate.py
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def scripted_backend(monkeypatch):
    monkeypatch.setattr(generation, "make_backend", lambda cfg, model, tokenizer, *args, **kwargs: ScriptedTeam(tokenizer))


def metrics_rows(folder):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
            for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("estimator", [["--advantage", "gae"], ["--advantage", "group", "--group_size", "2", "--credit", "shared"]])
def test_an_orchestrated_run_trains_every_agent_and_resumes_to_the_same_metrics(tiny_model_dir, tmp_path, scripted_backend,
                                                                                 estimator):
    import shutil
    common = ["--model", str(tiny_model_dir), "--lora_rank", "2", "--agents", "orchestrated",
              "--batch_size", "4", "--max_new_tokens", "16", "--eval_problems", "4", "--eval_samples", "1",
              "--eval_interval", "1", "--threads", "1", "--output_dir", str(tmp_path), *estimator]
    marft.train(config_lib.parse_args(common + ["--iterations", "2", "--run_name", "straight"]))
    rows = metrics_rows(tmp_path / "straight")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        # Every episode calls the solver once and the planner on even answers: calls = 1 + share of even answers.
        assert r["charts/calls/solver"] == 1.0 and r["charts/calls/verifier"] == 0.0
        assert r["charts/calls_per_episode"] == 1.0 + r["charts/calls/planner"]
        assert r["charts/finish_rate"] == 1.0 and r["charts/orchestration_errors"] == 0.0
        for role in ("orchestrator", "solver"):
            assert r[f"losses/approx_kl/{role}"] == r[f"losses/approx_kl/{role}"]  # every agent that acted was updated
    assert rows[0]["eval/finish_rate"] == 1.0 and "eval/calls/planner" in rows[-1]
    killed = tmp_path / "killed"  # as a kill -9 after iteration 2's metrics line, before its checkpoint
    shutil.copytree(tmp_path / "straight", killed)
    shutil.rmtree(killed / "checkpoints" / "iter_000002")
    (killed / "checkpoints" / "latest").write_text("iter_000001")
    marft.train(config_lib.parse_args(["--resume", str(killed), "--threads", "1"]))
    assert json.dumps(metrics_rows(killed)) == json.dumps(rows)


def test_evaluate_reports_the_realised_calls_of_each_episode(tiny_model_dir, tmp_path, scripted_backend):
    import evaluate
    report = evaluate.main(["--model", str(tiny_model_dir), "--agents", "orchestrated", "--limit", "4", "--samples", "1",
                            "--transcripts", "4", "--threads", "1", "--out", str(tmp_path / "eval.json")])
    for transcript in report["transcripts"]:
        a, op, b = transcript["problem"].removeprefix("What is ").removesuffix("?").split()
        answer = int(a) + int(b) if op == "+" else int(a) * int(b)
        step = transcript["steps"][0]
        assert step["calls"] == (["planner", "solver"] if answer % 2 == 0 else ["solver"]) and step["ended_by"] == "finish"
        assert [action["role"] for action in step["actions"]] == (
            ["orchestrator", "planner", "orchestrator", "solver", "orchestrator"] if answer % 2 == 0
            else ["orchestrator", "solver", "orchestrator"])
        assert transcript["solved"] == (answer % 3 != 0)
    assert report["metrics"]["eval/finish_rate"] == 1.0


# The orchestrator must learn whom to call: alice answers (a graded solver), bob cannot (not graded,
# so a step in which bob was called has no answer and earns 0). Both are described alike and the
# orchestrator's two worked examples call each once, so only the reward tells them apart.
WHOM_TO_CALL = {
    "agents": [
        {"role": "orchestrator", "system_prompt": "You lead a team. Choose the member who should answer the problem.",
         "examples": [{"user": "Problem: What is 4 + 1?", "assistant": "\\call{alice}"},
                      {"user": "Problem: What is 2 + 3?", "assistant": "\\call{bob}"}]},
        {"role": "bob", "system_prompt": "Repeat the problem in your own words. Do not solve it.",
         "description": "a member of the team"},
        {"role": "alice", "system_prompt": "You are a math solver. Compute the result and end with the final answer as \\boxed{N}.",
         "graded": True, "description": "a member of the team",
         "examples": [{"user": "Problem: What is 2 + 3?\n\nOrchestrator: \\call{alice}",
                       "assistant": "2 + 3 = 5. The answer is \\boxed{5}."}]},
    ],
    "orchestrator": "orchestrator",
    "max_calls": 1,
}


class _SecondRolloutPlayed(Exception):
    """Ends a run once the rollout under test is played: the update after it is not asserted."""


@pytest.mark.slow
def test_the_orchestrator_learns_whom_to_call(tmp_path, monkeypatch):
    """A real run of the embedded model (group advantages, 4 problems × 4 episodes, one-digit sums):
    the share of sampled training episodes whose orchestrator calls alice, measured on iteration 1's
    rollout (before any update) and on iteration 2's (after one update of every agent), must rise
    by at least 0.3; the run stops once iteration 2's rollout is played. Calibrated on 2 threads:
    0.375 → 1.0 (bob 0.31 → 0, errors 0.31 → 0); on one thread (the suite runs two test files at
    once on 2 cores) alice's share goes 0.375 → 1.0 too."""
    profile = tmp_path / "whom_to_call.json"
    profile.write_text(json.dumps(WHOM_TO_CALL))
    cfg = config_lib.parse_args(["--agents", str(profile), "--arithmetic_levels", "1", "--advantage", "group",
                              "--group_size", "4", "--batch_size", "4", "--credit", "shared", "--iterations", "2",
                              "--eval_problems", "1", "--eval_samples", "1", "--no-eval_greedy",  # not asserted: held-out kept short
                              "--max_new_tokens", "24", "--lr", "5e-4",
                              "--output_dir", str(tmp_path), "--run_name", "whom", "--threads", "1"])
    shares = []  # alice's share of the calls in each training rollout, as charts/calls/alice logs it

    def play_and_measure(generate, tokenizer, org, *args, **kwargs):
        rollout = run_episodes(generate, tokenizer, org, *args, **kwargs)
        shares.append(orchestration_metrics(rollout, org)["charts/calls/alice"])
        if len(shares) == 2:
            raise _SecondRolloutPlayed
        return rollout

    monkeypatch.setattr(marft, "run_episodes", play_and_measure)  # training's rollouts (evaluation plays its own)
    with pytest.raises(_SecondRolloutPlayed):
        marft.train(cfg)
    line = json.loads((tmp_path / "whom" / "metrics.jsonl").read_text().splitlines()[1])
    before, after = shares
    assert line["charts/calls/alice"] == before  # what was measured is what iteration 1 logged
    assert after >= before + 0.3, (before, after)
