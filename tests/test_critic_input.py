"""The centralised critic's input: V for the k-th action of a step reads the observation and *every*
earlier action of the step, whatever D lets the policy read (critic.py's docstring).

By the multi-agent advantage decomposition A(o, a^{1:N}) = Σ_m A^{i_m}(o, a^{i_1:m−1}, a^{i_m}),
agent i_m's advantage is conditioned on the actions before it: δ of the k-th action,
r_k + γ_a V_{k+1} − V_k, says something about action k only when V_{k+1} has seen it. Under
`parallel` (D ≡ 0) solver_b's policy prompt holds nothing of solver_a's action, so the critic
must read a prompt of its own there; under a chain (D(i, j) = 1 for all i < j) the critic's
input *is* the policy's prompt, the same token ids, and nothing is built twice.

The hand table (`parallel`, one problem "What is 2 + 3?" played twice, H = 1, credit `last`,
γ_a = 1, λ = 0.5; reward = mean of the two graded answers):

    episode 0: solver_a "\\boxed{5}" (right), solver_b "\\boxed{5}" (right)     R = 1
    episode 1: solver_a "\\boxed{6}" (wrong), solver_b "\\boxed{5}" (right)     R = 0.5

and a critic whose value is 0.3 on a prompt that shows no solver_a action, 0.9 on one that shows
solver_a's right answer, 0.4 on one that shows its wrong answer.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

import agents
import config as config_lib
import critic
import flex_pomdp
import generation
import marft
from envs import Grader, Problem
from flex_pomdp import load_organisation, unrolled_messages
from rollout import merge_rollouts, play_episodes, run_episodes
from scripted import ScriptedTeam, scripted_actions

PROBLEM = "What is 2 + 3?"
RIGHT_A, WRONG_A, ANSWER_B = "2 + 3 = 5. \\boxed{5}", "2 + 3 = 6. \\boxed{6}", "\\boxed{5}"
# What each solver says in episodes 0 and 1 (each role acts once per step, its episodes in order).
SCRIPT = {"solver_a": [RIGHT_A, WRONG_A], "solver_b": [ANSWER_B, ANSWER_B]}
V_UNSEEN, V_AFTER_RIGHT, V_AFTER_WRONG = 0.3, 0.9, 0.4


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(agents.embedded_tokenizer_folder())


def scripted_solvers(tokenizer):
    """A backend whose solver_a and solver_b give SCRIPT's texts, episode b getting SCRIPT[role][b mod 2]."""
    def generate(prompt_ids, adapter, sampling):
        role = adapter.removeprefix("policy_")
        return scripted_actions(tokenizer, [SCRIPT[role][b % 2] for b in range(len(prompt_ids))])
    return generate


def play_parallel(tokenizer, cfg, episodes=2):
    with Grader() as grader:
        return run_episodes(scripted_solvers(tokenizer), tokenizer, load_organisation("parallel"),
                            [Problem(PROBLEM, "5", "", "")] * episodes, grader, generation.Sampling(1.0, 1.0, 32), cfg)


def solver_b_critic_prompt(tokenizer, org, text_a):
    """What V reads for solver_b, written out by hand: solver_b's system prompt and worked example,
    then the problem and solver_a's action in the layout of every prompt ("<Role>: <action>")."""
    messages = unrolled_messages(org, "solver_b", PROBLEM, {})
    messages[-1] = {"role": "user", "content": f"Problem: {PROBLEM}\n\nSolver_a: {text_a}"}
    return agents.tokenize_prompts(tokenizer, [messages], 10_000)[0][0]


# ---------------------------------------------------------------------------------------------
# What the rollout records
# ---------------------------------------------------------------------------------------------

def test_a_parallel_rollout_keeps_the_critics_prompt_beside_the_policys(tokenizer):
    org = load_organisation("parallel")
    rollout = play_parallel(tokenizer, config_lib.Config(agents="parallel"))
    a, b = rollout.agent_samples(0), rollout.agent_samples(1)  # solver_a's and solver_b's samples, episodes 0 and 1
    tail = "<|im_end|>\n<|im_start|>assistant\n"
    for s, text_a in zip(b, (RIGHT_A, WRONG_A)):
        policy, = rollout.sequences([s])[0]
        value_input, = rollout.sequences([s], reader="critic")[0]
        assert tokenizer.decode(policy).endswith(f"Problem: {PROBLEM}{tail}")  # D ≡ 0: the policy reads the problem
        assert tokenizer.decode(value_input).endswith(f"Problem: {PROBLEM}\n\nSolver_a: {text_a}{tail}")
        assert value_input == solver_b_critic_prompt(tokenizer, org, text_a)
    # solver_a acts first: nothing came before it, and its critic reads its policy's prompt (nothing stored).
    assert rollout.sequences(a, reader="critic") == rollout.sequences(a)
    assert sorted(rollout.critic_prompt_ids) == b
    # Without a critic (group advantages) nothing is built for it.
    no_critic = play_parallel(tokenizer, config_lib.Config(agents="parallel", advantage="group", group_size=2, credit="shared"))
    assert no_critic.critic_prompt_ids == {}


@pytest.mark.parametrize("name", ["single", "chain", "chain3", "chain4", "orchestrated"])
def test_in_a_chain_the_critic_reads_the_policys_prompt_ids(tokenizer, name):
    """Chains (each agent reads all earlier ones) and orchestrated steps (each action reads all
    earlier ones): the critic's input, built and tokenized on its own, is token for token the
    policy's prompt, so the rollout stores nothing more and the default run's numbers stay."""
    org = load_organisation(name)
    # ScriptedTeam's orchestrator calls the planner, then the solver on 6; the solver alone on 7.
    problems = [Problem("What is 2 + 4?", "6", "", ""), Problem("What is 3 + 4?", "7", "", "")]
    cfg = config_lib.Config(agents=name)
    with Grader() as grader:
        rollout = run_episodes(ScriptedTeam(tokenizer).generate, tokenizer, org, problems, grader,
                               generation.Sampling(1.0, 1.0, 32), cfg)
    assert rollout.critic_prompt_ids == {}
    every = range(len(rollout.prompt_ids))
    assert rollout.sequences(every, reader="critic") == rollout.sequences(every)
    for s in every:
        b, t, k = rollout.episode[s], rollout.step[s], rollout.position[s]
        earlier = sorted((rollout.position[e], org.order[rollout.agent_index[e]], rollout.texts[e]) for e in every
                         if (rollout.episode[e], rollout.step[e]) == (b, t) and rollout.position[e] < k)
        messages = flex_pomdp.critic_messages(org, org.order[rollout.agent_index[s]], problems[b].problem,
                                              [(role, text) for _, role, text in earlier])
        assert agents.tokenize_prompts(tokenizer, [messages], cfg.max_prompt_tokens)[0][0] == rollout.prompt_ids[s]
    assert max(rollout.position) == {"single": 0, "chain": 1, "chain3": 2, "chain4": 3, "orchestrated": 4}[name]


def test_merged_rank_parts_keep_each_samples_critic_input(tokenizer):
    """Under torchrun each rank plays every G-th problem and the parts are merged into the rollout
    one process plays: the critic's inputs move with their samples' new indices."""
    org, cfg = load_organisation("parallel"), config_lib.Config(agents="parallel")
    problems = [Problem(f"What is {a} + 4?", str(a + 4), "", "") for a in range(1, 8)]
    team, sampling = ScriptedTeam(tokenizer), generation.Sampling(1.0, 1.0, 32)
    with Grader() as grader:
        whole = play_episodes(team.generate, tokenizer, org, problems, grader, sampling, cfg)
        merged = merge_rollouts([play_episodes(team.generate, tokenizer, org, problems[r::3], grader, sampling, cfg)
                                 for r in range(3)])
    assert sorted(whole.critic_prompt_ids) == whole.agent_samples(1)  # solver_b's 7 samples
    assert merged.critic_prompt_ids == whole.critic_prompt_ids and merged.prompt_ids == whole.prompt_ids


# ---------------------------------------------------------------------------------------------
# The hand table: which prompt each value is computed on, and GAE on the values
# ---------------------------------------------------------------------------------------------

def hand_critic(tokenizer):
    """A stand-in for critic.decision_values: V by what the prompt shows of solver_a (module docstring)."""
    def decision_values(model, value_heads, adapter, prompt_ids, response_ids, pad_id, level, *args, **kwargs):
        values = []
        for ids in prompt_ids:
            step = tokenizer.decode(ids).rsplit("Problem: ", 1)[1]  # the step's ô, after the worked example
            values.append(V_AFTER_RIGHT if f"Solver_a: {RIGHT_A}" in step else V_AFTER_WRONG if f"Solver_a: {WRONG_A}" in step
                          else V_UNSEEN)
        return torch.tensor(values).unsqueeze(-1)  # [n, 1]
    return decision_values


def no_policy(model, prompt_ids, response_ids, *args, **kwargs):
    """log π ≡ 0 (not looked at here): the tables policy_logprobs returns, [n, 1] and [n, K]."""
    n, longest = len(prompt_ids), max(len(r) for r in response_ids)
    mask = torch.tensor([[float(k < len(r)) for k in range(longest)] for r in response_ids])
    return agents.PolicyLogProbs(torch.zeros(n, 1), torch.zeros(n, 1), torch.ones(n, 1), torch.zeros(n, longest), mask)


def test_parallel_advantages_of_hand_values_read_on_the_critics_prompt(tokenizer, monkeypatch):
    # V of each action (samples: solver_a ep 0, ep 1, solver_b ep 0, ep 1):
    #   solver_a reads the problem alone:              V_a = 0.3, 0.3
    #   V for solver_b reads solver_a's action too:    V_b = 0.9 (after the right answer), 0.4 (after the wrong one)
    # Rewards, credit last: r_a = 0; r_b = R = 1 (episode 0), 0.5 (episode 1). Done after the step.
    #   episode 0: δ_b = 1 − 0.9 = 0.1, Â_b = 0.1;  δ_a = 0 + 1 · 0.9 − 0.3 = 0.6, Â_a = 0.6 + 1 · 0.5 · 0.1 = 0.65
    #   episode 1: δ_b = 0.5 − 0.4 = 0.1, Â_b = 0.1; δ_a = 0.4 − 0.3 = 0.1,         Â_a = 0.1 + 0.5 · 0.1 = 0.15
    # solver_a's right answer gets the larger Â through its own δ. (Had V for solver_b read solver_b's
    # policy prompt, V_b = 0.3 in both episodes, δ_a = 0 in both: nothing about solver_a's action.)
    monkeypatch.setattr(critic, "decision_values", hand_critic(tokenizer))
    monkeypatch.setattr(agents, "policy_logprobs", no_policy)
    monkeypatch.setattr(marft, "agent_prefix", lambda *args, **kwargs: None)  # no model: no prefix to run
    org = load_organisation("parallel")
    cfg = config_lib.Config(agents="parallel", credit="last", lam=0.5)
    rollout = play_parallel(tokenizer, cfg)
    assert rollout.team_reward[:, 0].tolist() == [1.0, 0.5]
    assert rollout.agent_index == [0, 0, 1, 1] and rollout.episode == [0, 1, 0, 1]
    old = marft.old_policy_and_values(None, None, tokenizer.pad_token_id, org, rollout, cfg)
    torch.testing.assert_close(old.values[:, 0], torch.tensor([0.3, 0.3, 0.9, 0.4]))
    advantages, returns, _, _ = marft.compute_advantages(org, rollout, old, cfg)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.65, 0.15, 0.1, 0.1]))
    torch.testing.assert_close(returns[:, 0], torch.tensor([0.95, 0.45, 1.0, 0.5]))  # R = Â + V


# ---------------------------------------------------------------------------------------------
# The real critic on a tiny model: old values and the critic's update, with the shared prefix
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["action", "token"])
def test_the_critic_is_run_and_trained_on_its_own_prompt_with_the_shared_prefix(tiny_model_dir, level, monkeypatch):
    base, tokenizer = agents.load_base_model(str(tiny_model_dir))
    torch.manual_seed(0)
    model = agents.attach_adapters(base, ["policy_solver_a", "policy_solver_b", "critic"],
                                   agents.lora_config(4, 8.0, ["q_proj", "v_proj"]))
    heads = critic.make_value_heads(model.config.hidden_size, ["critic"])
    with torch.no_grad():
        heads["critic"].weight.normal_(0, 1.0)  # V ≢ 0
    pad, org = tokenizer.pad_token_id, load_organisation("parallel")
    # 4 episodes: solver_b's critic prompts differ after the problem (solver_a's two texts), so a
    # forward batch shares a prefix; micro-batches of about 2 rows.
    cfg = config_lib.Config(agents="parallel", decision_unit=level, minibatch_size=4, ppo_epochs=1,
                         micro_batch_tokens=300)
    monkeypatch.setattr(marft, "FORWARD_BATCH_SIZE", 4)  # several no-grad batches
    rollout = play_parallel(tokenizer, cfg, episodes=4)
    value_inputs = {s: rollout.prompt_ids[s] for s in rollout.agent_samples(0)}  # solver_a: its own prompt
    value_inputs |= {s: solver_b_critic_prompt(tokenizer, org, SCRIPT["solver_a"][rollout.episode[s] % 2])
                     for s in rollout.agent_samples(1)}
    old = marft.old_policy_and_values(model, heads, pad, org, rollout, cfg)
    with torch.no_grad():
        for s, prompt in value_inputs.items():  # each value alone, in a plain pass over the critic's prompt
            alone = critic.decision_values(model, heads, "critic", [prompt], [rollout.response_ids[s]], pad, level,
                                           share_prefix=False)[0]
            torch.testing.assert_close(old.values[s, : alone.shape[0]], alone, atol=1e-5, rtol=0)
    seen = []  # every prompt the critic's update runs on
    real_values = critic.decision_values
    monkeypatch.setattr(critic, "decision_values", lambda model, heads, adapter, prompts, *rest: (
        seen.extend(map(tuple, prompts)), real_values(model, heads, adapter, prompts, *rest))[1])
    optimisers = {"critic": torch.optim.Adam(critic.critic_parameters(model, heads, "critic"), lr=0.01)}
    stats = marft.update_critic(model, heads, pad, rollout, old, old.values + 1.0, cfg, optimisers,
                                torch.Generator().manual_seed(0))
    assert sorted(seen) == sorted(map(tuple, value_inputs.values())) and stats["losses/value_loss"] > 0
