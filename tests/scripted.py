"""A scripted generation backend for tests: it proposes fixed responses, so a rollout is the same
whatever the sampling noise, the process or the rank that plays it (tests/test_orchestration.py,
tests/test_distributed.py and the torchrun worker tests/distributed_worker.py use it)."""
import re

import generation


class ScriptedBackend:
    """A generation backend's interface (generation.HFGenerator's) with nothing to sync or close:
    a scripted backend only writes `generate`. Its actions are taken as the policy's own (`exact`: the
    rollout is not reweighed against whatever log-probs it reports)."""

    exact = True

    def sync(self, model):
        pass

    def close(self):
        pass


class ScriptedTeam(ScriptedBackend):
    """A generation backend whose orchestrator calls the planner first on even answers, then the
    solver, then finishes (odd answers: solver, finish), and whose solver is right on answers not
    divisible by 3: realised sequences of 3 and 5 actions, rewards 0 and 1. The tiny model's
    log-probs of these tokens are what PPO trains on (the backend only proposes the tokens)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompt_ids, adapter, sampling):
        texts = []
        for ids in prompt_ids:
            turn = self.tokenizer.decode(ids).rsplit("Problem: ", 1)[1]
            a, op, b = re.match(r"What is (\d+) ([+*]) (\d+)\?", turn).groups()
            answer = int(a) + int(b) if op == "+" else int(a) * int(b)
            plan = (["planner"] if answer % 2 == 0 else []) + ["solver", "finish"]
            role = adapter.removeprefix("policy_")
            if role == "orchestrator":
                texts.append(f"Next. \\call{{{plan[turn.count(chr(10) * 2 + 'Orchestrator: ')]}}}")
            elif role == "planner":
                texts.append("Compute it.")
            else:
                texts.append(f"\\boxed{{{answer if answer % 3 else answer + 1}}}")
        return scripted_actions(self.tokenizer, texts)


def scripted_actions(tokenizer, texts: list[str]) -> generation.Actions:
    """The token ids of each text followed by EOS, as a backend returns them (log-probs 0)."""
    ids = [tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for text in texts]
    return generation.Actions(ids, [[0.0] * len(x) for x in ids])
