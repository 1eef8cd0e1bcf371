"""agents.py and critic.py on a tiny random Llama: log-probs, generation, adapter isolation, critic."""
import pytest
import torch

import agents
import critic

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture()
def setup(tiny_model_dir):
    base, tokenizer = agents.load_base_model(str(tiny_model_dir))
    torch.manual_seed(1)
    model = agents.attach_adapters(base, ["planner", "solver", "critic"], agents.lora_config(4, 8, TARGETS))
    # LoRA starts with B = 0 (every agent equals the base); give each adapter its own weights.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    heads = critic.make_value_heads(base.config.hidden_size, ["critic"])
    return model, tokenizer, heads


def reference_logprobs(model, adapter, prompt, response, temperature=1.0):
    """Token log-probs of `response` after `prompt` from one plain full forward (no padding)."""
    ids = torch.tensor([prompt + response])
    with agents.active_adapter(model, adapter), torch.no_grad():
        logits = model(input_ids=ids).logits[0] / temperature
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[len(prompt) - 1 + k, tok] for k, tok in enumerate(response)])


PROMPTS = [[1, 50, 60, 70, 80, 90], [1, 51, 61], [1, 52, 62, 72, 82]]
RESPONSES = [[100, 101, 2], [200], [300, 301, 302, 303, 2]]


@pytest.mark.parametrize("normalisation", ["sum", "mean"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_action_logprob_matches_unpadded_forward(setup, normalisation, temperature):
    model, tokenizer, _ = setup
    with torch.no_grad():
        batch, entropy = agents.action_logprobs(model, PROMPTS, RESPONSES, "solver", tokenizer.pad_token_id,
                                                normalisation, temperature)
    for k, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        tokens = reference_logprobs(model, "solver", p, r, temperature)
        expected = tokens.sum() if normalisation == "sum" else tokens.mean()
        assert batch[k].item() == pytest.approx(expected.item(), abs=1e-4)
    assert (entropy > 0).all()


def test_reference_policy_is_the_bare_base(setup, tiny_model_dir):
    model, tokenizer, _ = setup
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        ref, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, None, tokenizer.pad_token_id, "sum", 1.0)
        adapted, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, "solver", tokenizer.pad_token_id, "sum", 1.0)
        for k, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
            logp = torch.log_softmax(plain(input_ids=torch.tensor([p + r])).logits[0], -1)
            expected = sum(logp[len(p) - 1 + j, t].item() for j, t in enumerate(r))
            assert ref[k].item() == pytest.approx(expected, abs=1e-4)
    assert not torch.allclose(ref, adapted)  # the adapter really changes the policy


def test_update_of_one_agent_leaves_the_other_bit_identical(setup):
    model, tokenizer, _ = setup
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        planner_before, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, "planner", pad, "mean", 1.0)
        solver_before, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, "solver", pad, "mean", 1.0)
    optimiser = torch.optim.Adam(agents.adapter_parameters(model, "solver"), lr=1e-2)
    for _ in range(3):
        logprob, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, "solver", pad, "mean", 1.0)
        optimiser.zero_grad()
        (-logprob.mean()).backward()
        optimiser.step()
    with torch.no_grad():
        planner_after, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, "planner", pad, "mean", 1.0)
        solver_after, _ = agents.action_logprobs(model, PROMPTS, RESPONSES, "solver", pad, "mean", 1.0)
    assert torch.equal(planner_before, planner_after)
    assert solver_after.mean() > solver_before.mean()  # the update raised the solver's own objective


def test_greedy_generation_is_argmax_and_stops_at_eos(setup):
    model, tokenizer, _ = setup
    responses = agents.generate(model, tokenizer, PROMPTS, "planner", agents.Sampling(0.0, 1.0, 6), batch_size=3)
    for prompt, response in zip(PROMPTS, responses):
        assert 1 <= len(response) <= 6
        assert tokenizer.eos_token_id not in response[:-1]  # cut at (and including) the first EOS
        ids = torch.tensor([prompt + response])
        with agents.active_adapter(model, "planner"), torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        # Left padding in the batch must not change the result: each token is the unpadded argmax.
        for k, token in enumerate(response):
            assert logits[len(prompt) - 1 + k].argmax().item() == token


def test_sampling_is_reproducible_with_the_seed(setup):
    model, tokenizer, _ = setup
    sampling = agents.Sampling(1.0, 1.0, 5)
    torch.manual_seed(7)
    first = agents.generate(model, tokenizer, PROMPTS, "solver", sampling, batch_size=2)
    torch.manual_seed(7)
    second = agents.generate(model, tokenizer, PROMPTS, "solver", sampling, batch_size=2)
    assert first == second


def test_critic_value_reads_the_last_prompt_token_and_trains_only_critic_parameters(setup):
    model, tokenizer, heads = setup
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        assert torch.equal(critic.action_values(model, heads, "critic", PROMPTS, pad), torch.zeros(3))  # zero-init head
        heads["critic"].weight.normal_()
        values = critic.action_values(model, heads, "critic", PROMPTS, pad)
        for k, prompt in enumerate(PROMPTS):
            with agents.active_adapter(model, "critic"):
                hidden = model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0, -1]
            assert values[k].item() == pytest.approx((heads["critic"].weight[0] @ hidden + heads["critic"].bias).item(), abs=1e-4)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = critic.critic_parameters(model, heads, "critic")
    optimiser = torch.optim.Adam(params, lr=1e-2)
    loss = ((critic.action_values(model, heads, "critic", PROMPTS, pad) - 1.0) ** 2).mean()
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".critic." in n for n in changed)
    assert {n for n, p in model.named_parameters() if p.grad is not None} <= {n for n in before if ".critic." in n}


def test_prompt_truncation_keeps_the_last_tokens(tiny_model_dir):
    _, tokenizer = agents.load_base_model(str(tiny_model_dir))
    messages = [[{"role": "user", "content": "word " * 50}], [{"role": "user", "content": "hi"}]]
    full, truncated = agents.tokenize_prompts(tokenizer, messages, 10_000)
    assert truncated == 0
    limit = len(full[1]) + 1  # the short prompt fits, the long one does not
    cut, truncated = agents.tokenize_prompts(tokenizer, messages, limit)
    assert truncated == 1 and cut[0] == full[0][-limit:] and cut[1] == full[1]
    # Prompts end with the assistant header the model continues from.
    assert tokenizer.decode(full[1]).endswith("<|im_start|>assistant\n")


def test_embedded_model_loads_from_its_cache():
    model, tokenizer = agents.load_base_model("smollm2")
    assert model.config.model_type == "llama" and model.config.vocab_size == 49152
    assert tokenizer.eos_token == "<|im_end|>"
    assert not any(p.requires_grad for p in model.parameters())  # the base stays frozen
