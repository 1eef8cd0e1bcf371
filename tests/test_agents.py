"""agents.py and critic.py on a tiny random Llama: log-probs, generation, adapter isolation, critic."""
import pytest
import torch

import agents
import critic
import generation
import speed

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
    responses = generation.generate(model, tokenizer, PROMPTS, "planner", generation.Sampling(0.0, 1.0, 6), batch_size=3).token_ids
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
    sampling = generation.Sampling(1.0, 1.0, 5)
    torch.manual_seed(7)
    first = generation.generate(model, tokenizer, PROMPTS, "solver", sampling, batch_size=2)
    torch.manual_seed(7)
    second = generation.generate(model, tokenizer, PROMPTS, "solver", sampling, batch_size=2)
    assert first == second


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_decoding_gives_transformers_generate_tokens_and_logprobs(setup, temperature, top_p):
    """`generation.decode` (positions from the attention mask, the pad id after a stop, the default
    multinomial draw) against transformers' own `generate` on the same left-padded batch and seed,
    greedy and sampled: the same tokens, and each token's log-prob the log-softmax of the scores
    generate drew it from, bit for bit."""
    model, tokenizer, _ = setup
    pad = tokenizer.pad_token_id
    width = max(map(len, PROMPTS))
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in PROMPTS])  # [3, W]
    attention_mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in PROMPTS]).unsqueeze(1)).long()
    sampling = generation.Sampling(temperature, top_p, 6)
    stop_ids = [tokenizer.eos_token_id]
    drawing = dict(do_sample=False) if temperature == 0 else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    with agents.active_adapter(model, "planner"):
        torch.manual_seed(4)
        cache = generation.decoding_cache(model, [], len(PROMPTS))
        tokens, logprobs = generation.decode(model, input_ids, attention_mask, cache, sampling, stop_ids, pad)
        torch.manual_seed(4)
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, pad_token_id=pad,
                             eos_token_id=stop_ids, output_scores=True, return_dict_in_generate=True, **drawing)
    expected_tokens = out.sequences[:, width:]  # [3, steps]
    expected_logprobs = torch.stack([torch.log_softmax(scores.float(), -1).gather(-1, expected_tokens[:, [k]]).squeeze(-1)
                                     for k, scores in enumerate(out.scores)], dim=1)
    assert torch.equal(tokens, expected_tokens)
    assert torch.equal(logprobs, expected_logprobs)


def test_decoding_stops_rows_like_transformers_generate(setup):
    """Rows that draw a stop id: fed the pad id from then on, and the loop ends once every row has
    stopped; tokens and log-probs again those of transformers' generate. The stop ids are chosen
    from a first greedy decode: the token row 0 draws at step 2 (row 0 stops early), then every
    row's first token (all stop at once: one step); and no step at all with max_new_tokens 0."""
    model, tokenizer, _ = setup
    pad = tokenizer.pad_token_id
    width = max(map(len, PROMPTS))
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in PROMPTS])  # [3, W]
    attention_mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in PROMPTS]).unsqueeze(1)).long()
    greedy = generation.Sampling(0.0, 1.0, 6)

    def both(stop_ids):
        with agents.active_adapter(model, "planner"):
            cache = generation.decoding_cache(model, [], len(PROMPTS))
            ours = generation.decode(model, input_ids, attention_mask, cache, greedy, stop_ids, pad)
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=greedy.max_new_tokens,
                                 pad_token_id=pad, eos_token_id=stop_ids, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
        theirs = out.sequences[:, width:]
        logprobs = torch.stack([torch.log_softmax(scores.float(), -1).gather(-1, theirs[:, [k]]).squeeze(-1)
                                for k, scores in enumerate(out.scores)], dim=1)
        return ours, (theirs, logprobs)

    (first, _), _ = both([tokenizer.eos_token_id])
    early = int(first[0, 2])
    stop = int((first[0] == early).nonzero()[0])  # the step at which row 0 first draws it (≤ 2)
    (tokens, logprobs), (expected_tokens, expected_logprobs) = both([tokenizer.eos_token_id, early])
    assert torch.equal(tokens, expected_tokens) and torch.equal(logprobs, expected_logprobs)
    assert tokens[0, stop] == early and (tokens[0, stop + 1 :] == pad).all()  # row 0 stopped there …
    assert tokens.shape[1] > stop + 1  # … and the others ran on
    (tokens, logprobs), (expected_tokens, expected_logprobs) = both([tokenizer.eos_token_id, *first[:, 0].tolist()])
    assert tokens.shape == (3, 1) and torch.equal(tokens, expected_tokens) and torch.equal(logprobs, expected_logprobs)
    with agents.active_adapter(model, "planner"):  # (transformers' generate refuses 0)
        cache = generation.decoding_cache(model, [], len(PROMPTS))
        tokens, logprobs = generation.decode(model, input_ids, attention_mask, cache, generation.Sampling(0.0, 1.0, 0),
                                             [tokenizer.eos_token_id], pad)
    assert tokens.shape == logprobs.shape == (3, 0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generation_logprobs_are_the_sampled_tokens_logprobs_under_the_temperature(setup, temperature):
    """The backend's own log-probs equal an independent forward pass at logits / T (left padding
    in the generation batch must not shift them)."""
    model, tokenizer, _ = setup
    torch.manual_seed(3)
    actions = generation.generate(model, tokenizer, PROMPTS, "solver", generation.Sampling(temperature, 1.0, 5), batch_size=3)
    for prompt, response, logprobs in zip(PROMPTS, actions.token_ids, actions.logprobs):
        assert len(logprobs) == len(response)
        with agents.active_adapter(model, "solver"), torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0] / temperature
        expected = [torch.log_softmax(logits[len(prompt) - 1 + k], -1)[token].item() for k, token in enumerate(response)]
        assert logprobs == pytest.approx(expected, abs=1e-4)


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


def test_base_model_weights_exist_once_whatever_the_number_of_agents(tiny_model_dir):
    """All agents (and the critic) share one copy of the base weights: adding agents adds only
    their LoRA matrices. Counted by distinct storages, so a hidden copy would show."""
    def weight_bytes(roles):
        base, _ = agents.load_base_model(str(tiny_model_dir))
        base_storages = {p.untyped_storage().data_ptr() for p in base.parameters()}
        base_bytes = sum(p.untyped_storage().nbytes() for p in base.parameters())
        model = agents.attach_adapters(base, roles + ["critic"], agents.lora_config(4, 8.0, ["q_proj", "v_proj"]))
        shared, lora = {}, {}
        for name, p in model.named_parameters(remove_duplicate=False):
            (lora if "lora_" in name else shared)[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
        assert set(shared) == base_storages  # the very tensors of the base model, not copies
        assert sum(shared.values()) == base_bytes
        return sum(shared.values()), sum(lora.values())

    one_shared, one_lora = weight_bytes(["solver"])
    four_shared, four_lora = weight_bytes(["planner", "solver", "checker", "writer"])
    assert four_shared == one_shared
    assert four_lora == pytest.approx(one_lora * 5 / 2)  # 2 adapters (agent + critic) → 5 adapters


@pytest.mark.parametrize("allowed, threads, expected", [({0, 1}, 2, "0-1"), ({4, 5, 6, 7}, 2, "4-5"),
                                                        ({2, 5, 9}, 3, "2,5,9"), ({3}, 4, "3")])
def test_vllm_cpu_binding_uses_the_cores_this_process_may_run_on(monkeypatch, allowed, threads, expected):
    monkeypatch.setattr(generation.os, "sched_getaffinity", lambda pid: allowed)
    assert generation.cpu_binding(threads) == expected


def test_logprobs_keep_the_models_own_logit_processing(tmp_path):
    """Gemma-2 caps its logits after the LM head (tanh(logits / c) · c): the trainer's log-probs must
    be those of the model's own forward pass, not of a bare LM head."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, final_logit_softcapping=0.5, pad_token_id=0)
    torch.manual_seed(0)
    base = Gemma2ForCausalLM(config).eval()
    model = agents.attach_adapters(base, ["solver"], agents.lora_config(4, 8.0, ["q_proj", "v_proj"]))
    prompts, responses = [[1, 50, 60, 70, 80], [1, 51, 61]], [[100, 101, 102], [200, 201]]
    with torch.no_grad():
        token_lp, _, mask = agents.token_logprobs(model, prompts, responses, "solver", 0, 1.0)
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        expected = reference_logprobs(model, "solver", prompt, response)
        assert torch.allclose(token_lp[row, : len(response)], expected, atol=1e-5)
    # the cap really binds: every logit lies within ±0.5, so log-probs are near −log V
    assert token_lp[mask.bool()].min() > -torch.log(torch.tensor(400.0)) - 1.0


def test_the_models_generation_config_does_not_change_the_rollout_distribution(tiny_model_dir, tmp_path):
    """A generation_config.json with its own sampling settings (temperature 0.6, top_k 20, a repetition
    penalty, no repeated tokens, min_p) gives the same greedy and sampled actions, with the same
    log-probs, as the same model without one: marft's Sampling alone decides."""
    import json
    import shutil

    opinionated = tmp_path / "opinionated"
    shutil.copytree(tiny_model_dir, opinionated)
    (opinionated / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.8, "repetition_penalty": 5.0,
        "no_repeat_ngram_size": 1, "min_p": 0.5, "bos_token_id": 1, "eos_token_id": 2}))
    runs = {}
    for name, folder in (("plain", tiny_model_dir), ("opinionated", opinionated)):
        base, tokenizer = agents.load_base_model(str(folder))
        base.lm_head.weight.data.mul_(30.0)  # peaked distributions, so that the settings would bind
        torch.manual_seed(0)
        model = agents.attach_adapters(base, ["solver"], agents.lora_config(4, 8.0, ["q_proj", "v_proj"]))
        greedy = generation.generate(model, tokenizer, PROMPTS, "solver", generation.Sampling(0.0, 1.0, 12), batch_size=3)
        torch.manual_seed(5)
        sampled = generation.generate(model, tokenizer, PROMPTS, "solver", generation.Sampling(1.0, 1.0, 12), batch_size=3)
        runs[name] = (greedy.token_ids, sampled.token_ids, sampled.logprobs)
    greedy_ids = runs["plain"][0]
    assert any(len(set(r)) < len(r) for r in greedy_ids)  # greedy repeats tokens: no_repeat_ngram_size would bind
    assert runs["opinionated"] == runs["plain"]


def test_a_bfloat16_base_trains_float32_adapters_critic_and_optimiser_state(tiny_model_dir, tmp_path):
    """--base_dtype bfloat16: the frozen base weights take half the memory; every trainable weight,
    its gradient and its Adam state stay float32, and a whole run (generation, log-probs, values,
    both updates, checkpoint) goes through with no non-finite step."""
    import json

    import config as config_lib
    import marft
    import run as run_lib
    cfg = config_lib.parse_args(["--model", str(tiny_model_dir), "--base_dtype", "bfloat16", "--lora_rank", "2", "--batch_size", "2",
                              "--max_new_tokens", "6", "--eval_problems", "2", "--eval_samples", "1", "--iterations", "1",
                              "--threads", "1", "--output_dir", str(tmp_path), "--run_name", "bf16"])
    org, model, _, heads, optimisers = run_lib.build(cfg)
    frozen = [p for n, p in model.named_parameters() if "lora_" not in n]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)
    assert all(p.dtype == torch.float32 for p in heads.parameters())
    # One policy step and one critic step by hand: float32 gradients, finite, and nonzero where they
    # can be (the policy's B, which starts at 0; the critic's zero-initialised head, not yet its adapter).
    logprob = agents.policy_logprobs(model, PROMPTS, RESPONSES, "policy_solver", 2, "action", "sum", 1.0).logprob
    values = critic.decision_values(model, heads, "critic", PROMPTS, RESPONSES, 2, "action")
    (logprob.sum() + values.sum()).backward()
    policy_grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n and n.split(".")[-2] == "policy_solver"]
    critic_grads = [p.grad for p in critic.critic_parameters(model, heads, "critic") if p.grad is not None]
    for grads in (policy_grads, critic_grads):
        assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().max() > 0 for g in grads)
    for adapter in ("policy_solver", "critic"):
        optimisers[adapter].step()
        assert optimisers[adapter].state and all(state["exp_avg"].dtype == torch.float32
                                                 for state in optimisers[adapter].state.values())
    summary = marft.train(cfg)
    row = json.loads((tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()[1])
    assert all(row[f"losses/nonfinite_steps/{name}"] == 0.0 for name in ("planner", "solver", "critic"))
    assert summary["final_iteration"] == 1


def test_generation_logprobs_are_those_of_the_nucleus_it_samples_from_under_top_p(setup):
    """With top-p the recorded log-prob is the token's under the renormalised nucleus: larger than
    under the whole vocabulary by −log(nucleus mass), the same for every step of a row (the tiny
    random model's next-token distributions are close to uniform, so half the mass is about half
    the vocabulary and the gap about log 2)."""
    model, tokenizer, _ = setup
    torch.manual_seed(5)
    actions = generation.generate(model, tokenizer, PROMPTS, "solver", generation.Sampling(1.0, 0.5, 4), batch_size=3)
    whole, _, _ = agents.token_logprobs(model, PROMPTS, actions.token_ids, "solver", tokenizer.pad_token_id, 1.0)
    for row, logprobs in enumerate(actions.logprobs):
        gaps = [recorded - whole[row, k].item() for k, recorded in enumerate(logprobs)]
        assert gaps and all(0.5 < gap < 0.9 for gap in gaps)  # log 2 ≈ 0.69


def test_grouped_key_value_attention_gives_the_library_sdpa_numbers_without_copying_the_heads(setup):
    """load_base_model switches an "sdpa" model on the CPU to speed.GROUPED_KV_SDPA (the tiny Llama reads one
    key/value head from two query heads): on a padded batch, with and without a shared prefix,
    log-probs and the LoRA gradients equal those of transformers' own "sdpa", which copies the
    key/value head per query head, and that copy is no longer made."""
    model, tokenizer, _ = setup
    base = model.get_base_model()
    if not speed.cpu_paths_on():
        assert base.config._attn_implementation == "sdpa"  # MARFT_CPU_PATHS=off: plain transformers
        base.set_attn_implementation(speed.GROUPED_KV_SDPA)
    assert base.config._attn_implementation == speed.GROUPED_KV_SDPA

    def logprobs_and_gradients(share_prefix):
        model.zero_grad(set_to_none=True)
        prompts = [[1, 40, 41, 42] + p[1:] for p in PROMPTS]  # a 4-token shared prefix, then the rows' own tokens
        logprob, _ = agents.action_logprobs(model, prompts, RESPONSES, "solver", tokenizer.pad_token_id, "sum", 1.0,
                                            share_prefix=share_prefix)
        logprob.sum().backward()
        return logprob.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    import transformers.integrations.sdpa_attention as library
    copies, repeat_kv = [], library.repeat_kv
    library.repeat_kv = lambda states, n_rep: copies.append(n_rep) or repeat_kv(states, n_rep)
    try:
        for share_prefix in (False, True):
            grouped, grouped_grads = logprobs_and_gradients(share_prefix)
            assert not copies
            base.set_attn_implementation("sdpa")
            plain, plain_grads = logprobs_and_gradients(share_prefix)
            base.set_attn_implementation(speed.GROUPED_KV_SDPA)
            assert copies  # the library's path copies the heads
            copies.clear()
            torch.testing.assert_close(grouped, plain, rtol=1e-6, atol=1e-7)
            assert grouped_grads.keys() == plain_grads.keys() and grouped_grads
            for name in plain_grads:
                torch.testing.assert_close(grouped_grads[name], plain_grads[name], rtol=1e-5, atol=1e-7)
    finally:
        library.repeat_kv = repeat_kv
        base.set_attn_implementation("sdpa" if not speed.cpu_paths_on() else speed.GROUPED_KV_SDPA)


@pytest.mark.parametrize("tokenizer_eos, model_eos, expected", [
    (2, 2, [2]), (2, None, [2]), (2, 7, [2, 7]), (2, [7, 2], [2, 7]), (2, [2, 7, 9], [2, 7, 9]), (None, [0, 2], [0, 2]),
    (None, None, [])])
def test_stop_token_ids_are_the_tokenizers_eos_and_every_id_the_generation_config_declares(tokenizer_eos, model_eos, expected):
    assert generation.stop_token_ids(tokenizer_eos, model_eos) == expected


def test_generation_stops_at_an_end_of_turn_id_that_only_the_generation_config_declares(tiny_model_dir, tmp_path):
    """A chat model whose end-of-turn token is not its tokenizer's eos declares both in
    generation_config.json (eos_token_id [eos, end-of-turn]): each response stops at the first of
    them, keeps it (as it keeps the eos), and its log-probs are cut with it. The same seeded
    sampling from the same weights draws the same tokens until a row stops, so the end-of-turn id
    is a token the plain model samples at step 3 of row 0, and the expected responses are the
    plain ones cut after its first occurrence."""
    import json
    import shutil

    def sample(folder):
        base, tokenizer = agents.load_base_model(str(folder))
        torch.manual_seed(0)
        model = agents.attach_adapters(base, ["solver"], agents.lora_config(4, 8.0, ["q_proj", "v_proj"]))
        torch.manual_seed(5)
        return tokenizer, generation.generate(model, tokenizer, PROMPTS, "solver", generation.Sampling(1.0, 1.0, 12), batch_size=3)

    tokenizer, plain = sample(tiny_model_dir)
    assert [len(r) for r in plain.token_ids] == [12, 12, 12]  # no eos sampled: each runs to max_new_tokens
    end_of_turn = plain.token_ids[0][3]
    assert end_of_turn != tokenizer.eos_token_id and end_of_turn not in plain.token_ids[0][:3]
    declaring = tmp_path / "declaring"
    shutil.copytree(tiny_model_dir, declaring)
    (declaring / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": [tokenizer.eos_token_id, end_of_turn], "pad_token_id": 2}))
    _, cut = sample(declaring)
    expected = [r[: r.index(end_of_turn) + 1] if end_of_turn in r else r for r in plain.token_ids]
    assert len(expected[0]) == 4
    assert cut.token_ids == expected
    assert cut.logprobs == [pytest.approx(lp[: len(r)], abs=1e-6) for lp, r in zip(plain.logprobs, expected)]


def test_vllm_requests_stop_at_every_end_of_turn_id_and_responses_are_cut_at_the_first(monkeypatch):
    """The vLLM backend without an engine: a stand-in records the SamplingParams of each request and
    returns fixed completions. Every request stops at each stop id, and a completion that holds a
    stop id is cut after its first one (token ids and log-probs), as the hf backend cuts."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    completions = [[5, 7, 9, 2], [5, 9, 2, 7], [5, 9, 11]]  # end-of-turn 7 first; eos 2 first; no stop id
    seen = []

    def engine_generate(prompts, params, lora_request, use_tqdm):
        seen.extend(params)
        return [SimpleNamespace(outputs=[SimpleNamespace(
            token_ids=tokens, logprobs=[{t: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(tokens)])])
            for tokens in completions]

    backend = object.__new__(generation.VLLMGenerator)  # no engine: only its generate method is under test
    backend.engine, backend.requests, backend.stop_ids = SimpleNamespace(generate=engine_generate), {}, [2, 7]
    actions = backend.generate(PROMPTS, None, generation.Sampling(1.0, 1.0, 8))
    assert len(seen) == 3 and all({2, 7} <= set(p.stop_token_ids) and p.max_tokens == 8 for p in seen)
    assert actions.token_ids == [[5, 7], [5, 9, 2], [5, 9, 11]]
    assert actions.logprobs == [[-0.5, -1.0], [-0.5, -1.0, -1.5], [-0.5, -1.0, -1.5]]


def test_the_lm_head_runs_only_at_the_positions_that_predict_response_tokens(setup):
    """agents.head_at: the output head sees [n, longest response, H], not every column of the batch,
    and the log-probs are still those of a plain unpadded forward (the tests above)."""
    model, tokenizer, _ = setup
    shapes = []
    handle = model.get_base_model().get_output_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(out.shape)))
    try:
        with torch.no_grad():
            agents.token_logprobs(model, PROMPTS, RESPONSES, "solver", tokenizer.pad_token_id, 1.0)
    finally:
        handle.remove()
    assert shapes == [(len(PROMPTS), max(map(len, RESPONSES)), model.get_base_model().config.vocab_size)]
