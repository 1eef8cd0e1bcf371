"""The centralised critic V_φ: a LoRA adapter on the shared base plus a scalar value head.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "MARFT" (centralised training, decentralised
execution; the multi-agent advantage decomposition). README: "Paper ↔ code".

One shared critic scores every action of a step. Its input for the k-th action a^i_{t,k} of step t
(agent i = σ_k under a fixed D, the k-th of the realised sequence with an orchestrator) is

    x^i_{t,k} = o_t ⊕ a_{t,<k}        the observation and every earlier action of the step, in σ order,

under agent i's system prompt and worked examples, so the critic knows whose turn it is
(flex_pomdp.critic_messages). D decides what a *policy* reads (ô^i_t); the critic is centralised
for every D: by the multi-agent advantage decomposition
A(o, a^{i_1:N}) = Σ_m A^{i_m}(o, a^{i_1:m−1}, a^{i_m}), agent i_m's advantage is conditioned on
the actions before it, and the action-level δ_{t,k} = r_{t,k} + γ_a V_{t,k+1} − V_{t,k} carries
information about a_{t,k} only because V_{t,k+1} has read it. In a chain (D(a^i, a^j) = 1 for all
i < j) and in an orchestrated step x^i_{t,k} is the policy's prompt ô^i_t, token for token; under
D ≡ 0 (`parallel`) the value for solver_b reads solver_a's action, which solver_b's policy never
sees, and the rollout keeps that input beside the prompt (rollout.Rollout.critic_prompt_ids).

    V^i_{t,k} = V_φ(x^i_{t,k}) = w · h_φ(x^i_{t,k})[last prompt token] + b          (action level)
    V(x^i_{t,k}, w_<j) = w · h_φ(x^i_{t,k} ⊕ w_<j)[last position] + b               (token level)

h_φ is the base model's last hidden layer under the `critic` adapter; (w, b) is a Linear(H, 1)
head, zero-initialised so that V ≡ 0 before training. Only the critic adapter and head are trained
by the value loss; the policies' adapters and the base stay untouched. The functions below take
the critic's input ids as their `prompt_ids` (marft reads them with `Rollout.sequences(…, reader="critic")`).
"""
from __future__ import annotations

import torch
from peft import PeftModel

from agents import SharedPrefix, active_adapter, adapter_parameters, forward_responses, response_mask

SHARED_CRITIC = "critic"


def make_value_heads(hidden_size: int, adapter_names: list[str]) -> torch.nn.ModuleDict:
    """One zero-initialised Linear(H, 1) per critic adapter: V ≡ 0 at the start."""
    heads = torch.nn.ModuleDict()
    for name in adapter_names:
        head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        heads[name] = head
    return heads


def action_values(model: PeftModel, value_heads: torch.nn.ModuleDict, adapter: str, prompt_ids: list[list[int]],
                  pad_id: int, share_prefix: bool = True, prefix: SharedPrefix | None = None) -> torch.Tensor:
    """V_φ(x) for a batch of critic inputs x [n] (module docstring): the head at the last prompt token."""
    with active_adapter(model, adapter):
        last = forward_responses(model, prompt_ids, [[] for _ in prompt_ids], pad_id, "hidden", share_prefix,
                                 prefix)[:, 0]  # [n, H]
    return value_heads[adapter](last.float()).squeeze(-1).cpu()  # [n], on the CPU like the trainer's tables


def token_values(model: PeftModel, value_heads: torch.nn.ModuleDict, adapter: str, prompt_ids: list[list[int]],
                 response_ids: list[list[int]], pad_id: int, share_prefix: bool = True,
                 prefix: SharedPrefix | None = None) -> torch.Tensor:
    """V_φ(x, w_<k) for k = 1 … K of each response, [n, L] (0 on padding): column k at the position that
    predicts token k, so column 0 is the action-level V_φ(x), and the critic reads the policy's tokens."""
    with active_adapter(model, adapter):
        longest = max(len(r) for r in response_ids)
        gathered = forward_responses(model, prompt_ids, response_ids, pad_id, "hidden", share_prefix,
                                     prefix)[:, :longest]  # [n, L, H]
    mask = response_mask(response_ids, gathered.device)  # [n, L]
    return (value_heads[adapter](gathered.float()).squeeze(-1) * mask).cpu()  # the head in float32


def decision_values(model: PeftModel, value_heads: torch.nn.ModuleDict, adapter: str, prompt_ids: list[list[int]],
                    response_ids: list[list[int]], pad_id: int, level: str, share_prefix: bool = True,
                    prefix: SharedPrefix | None = None) -> torch.Tensor:
    """V_φ per decision, [n, L] like `agents.policy_logprobs`: V(x) at the action level, V(x, w_<k) at the
    token level, x the critic's input ids. share_prefix, prefix: as in `agents.forward_responses`."""
    if level == "token":
        return token_values(model, value_heads, adapter, prompt_ids, response_ids, pad_id, share_prefix, prefix)
    return action_values(model, value_heads, adapter, prompt_ids, pad_id, share_prefix, prefix).unsqueeze(-1)


def critic_parameters(model: PeftModel, value_heads: torch.nn.ModuleDict, adapter: str) -> list[torch.nn.Parameter]:
    """φ: the critic adapter's LoRA weights and its head (what the critic optimiser owns)."""
    return adapter_parameters(model, adapter) + list(value_heads[adapter].parameters())
