"""examples/desks.py, design 9 of the team-wins study (results/team-wins/): each clerk of the trio reads only its
own note (the Flex-POMDP's own observation o^j), the centralised critic reads all three, and one clerk reads them all."""
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import agents
import config as config_lib
import generation
from envs import Grader
from flex_pomdp import joint_observation, own_observation, unrolled_messages
from rollout import play_episodes
from scripted import scripted_actions
from tasks import organisation_of

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("desks_task", ROOT / "examples" / "desks.py")
desks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(desks)
TRIO = ["stock_clerk", "delivery_clerk", "box_clerk"]
# Note 1: A = 345·12 = 4140; note 2: B = 210·40 = 8400; note 3: C = 15 + 26 = 41
NOTE_1 = "Tom has 12 boxes with 345 pens in each. Later 30 more boxes of 345 pens arrive."
NOTE_2 = "A shop fills 31 crates with 210 bolts each. Then 40 more crates come, also with 210 bolts each."
NOTE_3 = "Li stacks 15 trays; each holds 118 cans. Then 26 new trays of 118 cans come in."
PROBLEM = desks.stock.Problem(problem=f"Note 1: {NOTE_1}\nNote 2: {NOTE_2}\nNote 3: {NOTE_3}", answer="4140|8400|41",
                              level="train_template", type="train_template")


def triples(problem):
    """(a, b, k) of each note: a the only 3-digit number, b and k the 2-digit ones (k first in a held-out wording)."""
    out = []
    for note in desks.notes(problem.problem):
        numbers = [int(n) for n in re.findall(r"\d+", note)]
        a = next(n for n in numbers if n >= 100)
        b, k = sorted(set(n for n in numbers if n < 100), key=numbers.index)
        out.append((a, k, b) if problem.level == "held_out_template" else (a, b, k))
    return out


def test_part_a_reads_note_1_part_b_note_2_part_c_note_3_and_held_out_notes_share_no_operands():
    train, held_out = desks.load(SimpleNamespace(seed=1))
    assert (len(train), len(held_out)) == (400, 48)
    for p in train + held_out:
        (a1, b1, _), (a2, _, k2), (_, b3, k3) = triples(p)
        assert p.answer == f"{a1 * b1}|{a2 * k2}|{b3 + k3}"
    operands = lambda problems: {t for p in problems for t in triples(p)}
    assert not operands(train) & operands(held_out)
    assert sum(p.level == "held_out_template" for p in held_out) == 24 and all(p.level == "train_template" for p in train)
    assert triples(PROBLEM) == [(345, 12, 30), (210, 31, 40), (118, 15, 26)]


def test_each_clerk_of_the_trio_observes_its_own_note_and_the_one_clerk_all_three():
    assert desks.Env(PROBLEM, TRIO).reset() == dict(zip(TRIO, [NOTE_1, NOTE_2, NOTE_3]))
    assert desks.Env(PROBLEM, ["clerk"]).reset() == PROBLEM.problem
    views = desks.Env(PROBLEM, TRIO).reset()
    assert own_observation(views, "delivery_clerk") == NOTE_2 and own_observation("one text", "delivery_clerk") == "one text"
    org = organisation_of(config_lib.Config(task="examples/desks.py", agents="trio"))
    assert joint_observation(org, views) == f"Stock_clerk reads: {NOTE_1}\n\nDelivery_clerk reads: {NOTE_2}\n\nBox_clerk reads: {NOTE_3}"


@pytest.mark.parametrize("texts, parts", [
    (("\\calc{345*12}", "\\calc{210*40}", "\\calc{15+26}"), (True, True, True)),
    # the delivery clerk used note 1's numbers: only its own note's count is paid
    (("\\calc{345*12}", "\\calc{345*30}", "\\calc{15+26}"), (True, False, True)),
])
def test_the_trio_is_paid_a_third_per_part_of_its_own_note(texts, parts):
    _, reward, _, info = desks.Env(PROBLEM, TRIO).step(dict(zip(TRIO, texts)))
    assert (info["part_a"], info["part_b"], info["part_c"]) == parts
    assert reward == pytest.approx(sum(parts) / 3)
    assert info["role_rewards"] == pytest.approx({role: holds / 3 for role, holds in zip(TRIO, parts)})


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(agents.embedded_tokenizer_folder())


def test_in_the_rollout_each_policy_reads_its_own_note_and_the_critic_all_three(tokenizer):
    cfg = config_lib.Config(task="examples/desks.py", agents="trio")
    org = organisation_of(cfg)
    said = {"stock_clerk": "\\calc{345*12}", "delivery_clerk": "\\calc{210*40}", "box_clerk": "\\calc{15+27}"}
    generate = lambda prompt_ids, adapter, sampling: scripted_actions(tokenizer, [said[adapter.removeprefix("policy_")]])
    with Grader() as grader:
        rollout = play_episodes(generate, tokenizer, org, [PROBLEM], grader, generation.Sampling(1.0, 1.0, 16), cfg)
    assert rollout.team_reward[0, 0].item() == pytest.approx(2 / 3)  # part C is 41, not 42
    views = dict(zip(TRIO, [NOTE_1, NOTE_2, NOTE_3]))
    for k, role in enumerate(TRIO):
        s, = rollout.agent_samples(k)
        policy, = rollout.sequences([s])[0]
        value_input, = rollout.sequences([s], reader="critic")[0]
        own = unrolled_messages(org, role, views[role], {})
        assert policy == agents.tokenize_prompts(tokenizer, [own], 10_000)[0][0]  # o^j: its own note alone
        earlier = "".join(f"\n\n{r.capitalize()}: {said[r]}" for r in TRIO[:k])
        whole = own[:-1] + [{"role": "user", "content": f"Problem: {joint_observation(org, views)}{earlier}"}]
        assert value_input == agents.tokenize_prompts(tokenizer, [whole], 10_000)[0][0]  # o_t ⊕ a_{t,<k}


def test_a_task_whose_reset_leaves_a_role_without_its_own_observation_is_refused_before_the_run_folder(monkeypatch):
    import rollout
    cfg = config_lib.Config(task="examples/desks.py", agents="trio")
    class Forgetful(desks.Env):
        def reset(self, seed=None):
            return {"stock_clerk": NOTE_1, "box_clerk": NOTE_3}
    monkeypatch.setattr(rollout.tasks, "make_env", lambda task, problem, cfg, context: Forgetful(problem, TRIO))
    with pytest.raises(ValueError, match="none to delivery_clerk: give every agent"):
        rollout.check_environment(cfg, organisation_of(cfg), {"training": (0, PROBLEM)})
