"""Prefix sharing (agents.forward_responses, generation.generate): a batch's common prompt prefix is
run once and its keys/values reused. Every number must be the plain pass's, within float rounding:
log-probs, entropies, values and the gradients that reach the LoRA weights through the prefix,
on the three agents of chain3 at both levels, in generation, and over whole training iterations."""

import pytest
import torch

import agents
import config
import critic
import generation
import marft
from conftest import assert_runs_log_alike
from envs import make_arithmetic_problems
from flex_pomdp import load_organisation, unrolled_messages

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RTOL = 1e-5  # the bound: relative agreement of every table and gradient


@pytest.mark.parametrize("prompts, expected", [
    ([[5, 6, 7, 8], [5, 6, 9, 8]], 2),  # the common run stops at the first difference
    ([[5, 6, 7], [5, 6, 7, 8, 9]], 2),  # a prompt that is a prefix of another keeps its last token
    ([[5, 6, 7], [5, 6, 7]], 2),  # identical prompts (a group's episodes): all but the last token
    ([[5, 6], [4, 6]], 0),  # nothing in common
    ([[5, 6, 7, 8]], 0),  # one prompt: nothing to share
    ([[5], [5, 6]], 0),  # a one-token prompt leaves no room
])
def test_shared_prefix_length_by_hand(prompts, expected):
    assert agents.shared_prefix_length(prompts) == expected


@pytest.fixture()
def chain3(tiny_model_dir):
    """The tiny Llama with the chain3 agents' adapters and a critic, each with its own nonzero LoRA
    weights, and each agent's real unrolled-observation prompts for four problems."""
    base, tokenizer = agents.load_base_model(str(tiny_model_dir))
    org = load_organisation("chain3")
    torch.manual_seed(4)
    model = agents.attach_adapters(base, [*org.order, "critic"], agents.lora_config(4, 8, TARGETS))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    heads = critic.make_value_heads(base.config.hidden_size, ["critic"])
    with torch.no_grad():
        heads["critic"].weight.normal_(0, 1.0)
    problems = make_arithmetic_problems("train", seed=1)[:4]
    actions = ["Add 3 and 4.", "Multiply the two digits first, then give the product.", "7", "The answer is \\boxed{12}."]
    prompts = {}
    for role in org.order:
        parents = {parent: actions[(i + len(parent)) % len(actions)] for i, parent in enumerate(org.parents(role))}
        messages = [unrolled_messages(org, role, p.problem, {k: f"{v} ({j})" for k, v in parents.items()})
                    for j, p in enumerate(problems)]
        prompts[role] = agents.tokenize_prompts(tokenizer, messages, 1024)[0]
    generator = torch.Generator().manual_seed(0)
    responses = [torch.randint(100, 5000, (length,), generator=generator).tolist() + [2] for length in (3, 9, 1, 6)]
    return model, tokenizer, heads, org, prompts, responses


def assert_relatively_equal(shared: torch.Tensor, plain: torch.Tensor):
    assert shared.shape == plain.shape
    scale = plain.abs().max().clamp(min=1e-12)
    assert ((shared - plain).abs().max() / scale).item() <= RTOL
    assert ((shared - plain).norm() / plain.norm().clamp(min=1e-12)).item() <= RTOL


def policy_pass(model, adapter, prompts, responses, pad, level, share):
    """Tables of one policy pass and the gradient of a loss that reads all of them."""
    model.zero_grad(set_to_none=True)
    out = agents.policy_logprobs(model, prompts, responses, adapter, pad, level, "mean", 0.8, share_prefix=share)
    weights = torch.linspace(-1.0, 1.0, out.logprob.numel()).view_as(out.logprob)
    (out.logprob * weights).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in agents.adapter_parameters(model, adapter)])
    return out, grads


def critic_pass(model, heads, prompts, responses, pad, level, share):
    model.zero_grad(set_to_none=True)
    heads.zero_grad(set_to_none=True)
    values = critic.decision_values(model, heads, "critic", prompts, responses, pad, level, share_prefix=share)
    (values * torch.linspace(0.5, 2.0, values.numel()).view_as(values)).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in critic.critic_parameters(model, heads, "critic")])
    return values, grads


@pytest.mark.parametrize("level", ["action", "token"])
def test_log_probs_values_and_gradients_agree_with_and_without_the_shared_prefix(chain3, level):
    model, tokenizer, heads, org, prompts, responses = chain3
    pad = tokenizer.pad_token_id
    assert all(agents.shared_prefix_length(prompts[role]) > 20 for role in org.order)  # every role's instructions are shared
    for role in org.order:
        plain, plain_grads = policy_pass(model, role, prompts[role], responses, pad, level, share=False)
        shared, shared_grads = policy_pass(model, role, prompts[role], responses, pad, level, share=True)
        for table in ("logprob", "entropy", "token_logprob"):
            assert_relatively_equal(getattr(shared, table).detach(), getattr(plain, table).detach())
        assert torch.equal(shared.mask, plain.mask) and torch.equal(shared.token_mask, plain.token_mask)
        assert plain_grads.abs().sum() > 0  # the loss reaches this agent's LoRA weights
        assert_relatively_equal(shared_grads, plain_grads)
        plain_values, plain_grads = critic_pass(model, heads, prompts[role], responses, pad, level, share=False)
        shared_values, shared_grads = critic_pass(model, heads, prompts[role], responses, pad, level, share=True)
        assert_relatively_equal(shared_values.detach(), plain_values.detach())
        assert_relatively_equal(shared_grads, plain_grads)


@pytest.mark.parametrize("level", ["action", "token"])
def test_a_prefix_run_once_for_several_micro_batches_gives_the_plain_tables_and_gradients(chain3, level):
    """The update's micro-batches: the prefix of an agent's 4 rows is run once
    (agents.run_shared_prefix), rows 0–1 and 2–3 each make a pass and a backward that read it,
    then agents.backward_shared_prefix sends their summed gradient through the prefix. Tables and
    the accumulated gradient are those of one plain pass over the 4 rows."""
    model, tokenizer, heads, org, prompts, responses = chain3
    pad = tokenizer.pad_token_id
    for role in org.order:
        plain, plain_grads = policy_pass(model, role, prompts[role], responses, pad, level, share=False)
        weights = torch.linspace(-1.0, 1.0, plain.logprob.numel()).view_as(plain.logprob)
        model.zero_grad(set_to_none=True)
        prefix = agents.run_shared_prefix(model, prompts[role], role)
        assert len(prefix.tokens) == agents.shared_prefix_length(prompts[role]) > 20
        parts = []
        for rows in (slice(0, 2), slice(2, 4)):
            out = agents.policy_logprobs(model, prompts[role][rows], responses[rows], role, pad, level, "mean", 0.8,
                                         prefix=prefix)
            width = out.logprob.shape[1]
            (out.logprob * weights[rows, :width]).sum().backward()
            parts.append(out)
        agents.backward_shared_prefix(prefix)
        grads = torch.cat([p.grad.flatten() for p in agents.adapter_parameters(model, role)])
        assert_relatively_equal(grads, plain_grads)
        for table in ("logprob", "entropy"):
            width = getattr(plain, table).shape[1]
            joined = torch.cat([torch.nn.functional.pad(getattr(o, table), (0, width - getattr(o, table).shape[1])) for o in parts])
            assert_relatively_equal(joined.detach(), getattr(plain, table).detach())

        plain_values, plain_grads = critic_pass(model, heads, prompts[role], responses, pad, level, share=False)
        model.zero_grad(set_to_none=True)
        heads.zero_grad(set_to_none=True)
        prefix = agents.run_shared_prefix(model, prompts[role], "critic")
        scale = torch.linspace(0.5, 2.0, plain_values.numel()).view_as(plain_values)
        values = []
        for rows in (slice(0, 2), slice(2, 4)):
            part = critic.decision_values(model, heads, "critic", prompts[role][rows], responses[rows], pad, level, prefix=prefix)
            (part * scale[rows, : part.shape[1]]).sum().backward()
            values.append(torch.nn.functional.pad(part.detach(), (0, plain_values.shape[1] - part.shape[1])))
        agents.backward_shared_prefix(prefix)
        grads = torch.cat([p.grad.flatten() for p in critic.critic_parameters(model, heads, "critic")])
        assert_relatively_equal(torch.cat(values), plain_values.detach())
        assert_relatively_equal(grads, plain_grads)


def test_a_prompt_that_does_not_start_with_the_given_prefix_is_refused(chain3):
    model, tokenizer, heads, org, prompts, responses = chain3
    prefix = agents.run_shared_prefix(model, prompts["planner"], "planner")
    with pytest.raises(ValueError, match="does not start with the shared prefix"):
        agents.policy_logprobs(model, prompts["solver"], responses, "solver", tokenizer.pad_token_id, "action", "sum", 1.0,
                               prefix=prefix)


def test_the_gradient_flows_through_the_prefix_into_the_lora_weights(chain3):
    """With the prefix's keys and values detached the gradient would differ: proof that the shared
    pass keeps the prefix in the graph."""
    model, tokenizer, heads, org, prompts, responses = chain3
    role = org.order[1]
    pad = tokenizer.pad_token_id
    _, with_prefix = policy_pass(model, role, prompts[role], responses, pad, "action", share=True)
    real_cache = agents.prefix_cache

    def detached_cache(model_, prefix, rows):
        cache = real_cache(model_, prefix, rows)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.detach(), layer.values.detach()
        return cache

    agents.prefix_cache = detached_cache
    try:
        _, without_prefix = policy_pass(model, role, prompts[role], responses, pad, "action", share=True)
    finally:
        agents.prefix_cache = real_cache
    assert ((with_prefix - without_prefix).norm() / with_prefix.norm()).item() > 1e-3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_with_the_shared_prefix_gives_the_plain_actions_and_log_probs(chain3, temperature):
    """Same seed, same tokens; the recorded log-probs of the sampled tokens agree too, and both
    are those of an independent forward pass under logits / T."""
    model, tokenizer, heads, org, prompts, responses = chain3
    role = org.order[1]
    sampling = generation.Sampling(temperature, 1.0, 8)
    results = {}
    for share in (False, True):
        torch.manual_seed(11)
        results[share] = generation.generate(model, tokenizer, prompts[role], role, sampling, 3, share_prefix=share)
    assert results[True].token_ids == results[False].token_ids
    recomputed, _, _ = agents.token_logprobs(model, prompts[role], results[True].token_ids, role, tokenizer.pad_token_id,
                                             temperature or 1.0, share_prefix=False)
    for row, (shared, plain) in enumerate(zip(results[True].logprobs, results[False].logprobs)):
        assert shared == pytest.approx(plain, rel=1e-4, abs=1e-5)
        assert shared == pytest.approx(recomputed[row, : len(shared)].tolist(), rel=1e-4, abs=1e-5)


def test_training_iterations_with_and_without_prefix_sharing_log_the_same_metrics(tiny_model_dir, tmp_path, varied_rewards):
    """Two iterations of chain3 on the tiny model, critic + GAE, token level, varied rewards so
    that returns are not zero: every logged number (rewards, losses, KL, explained variance,
    held-out accuracy) agrees to float rounding."""
    common = ["--model", str(tiny_model_dir), "--lora_rank", "2", "--agents", "chain3",
              "--decision_unit", "token", "--batch_size", "3", "--iterations", "2", "--max_new_tokens", "5", "--eval_problems", "2",
              "--eval_samples", "1", "--threads", "1", "--output_dir", str(tmp_path)]
    for name, flag in (("plain", "--no-prefix_sharing"), ("shared", "--prefix_sharing")):
        marft.train(config.parse_args(common + [flag, "--run_name", name]))
    plain = assert_runs_log_alike(tmp_path / "plain", tmp_path / "shared", lines=3)
    assert plain[-1]["losses/value_loss"] > 0 and plain[-1]["losses/policy_loss/verifier"] != 0
