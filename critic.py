"""The centralised critic V_φ(ô^i_t): a LoRA adapter on the shared base plus a scalar value head.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "MARFT" (centralised training, decentralised
execution). README: "Paper ↔ code".

One shared critic scores the unrolled observation of any agent. Because ô^i_t contains agent i's
system prompt and the actions it depends on, the critic knows whose turn it is and what has been
said so far in the step:

    V^i_t = V_φ(ô^i_t) = w · h_φ(ô^i_t)[last prompt token] + b                 (action level)
    V(ô^i_t, w_<k) = w · h_φ(ô^i_t ⊕ w_<k)[last position] + b                  (token level)

h_φ is the base model's last hidden layer under the `critic` adapter; (w, b) is a Linear(H, 1)
head, zero-initialised so that V ≡ 0 before training. Option: one critic per agent (adapter
`critic_<role>` and its own head). Only the critic adapters and heads are trained by the value loss;
the policies' adapters and the base stay untouched.
"""
from __future__ import annotations

import torch
from peft import PeftModel

from agents import SharedPrefix, active_adapter, adapter_parameters, forward_responses

SHARED_CRITIC = "critic"


def critic_adapter_name(role: str, per_agent: bool) -> str:
    """The adapter φ that scores agent `role`'s observations."""
    return f"critic_{role}" if per_agent else SHARED_CRITIC


def critic_adapter_names(order: tuple[str, ...], per_agent: bool) -> list[str]:
    """φ of every agent's critic, each name once, in σ order."""
    return list(dict.fromkeys(critic_adapter_name(role, per_agent) for role in order))


def make_value_heads(hidden_size: int, adapter_names: list[str]) -> torch.nn.ModuleDict:
    """One zero-initialised Linear(H, 1) per critic adapter: V ≡ 0 at the start."""
    heads = torch.nn.ModuleDict()
    for name in adapter_names:
        head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        heads[name] = head
    return heads


def action_values(
    model: PeftModel,
    value_heads: torch.nn.ModuleDict,
    adapter: str,
    prompt_ids: list[list[int]],
    pad_id: int,
    share_prefix: bool = True,
    prefix: SharedPrefix | None = None,
) -> torch.Tensor:
    """V_φ(ô) for a batch of unrolled-observation prompts [n]: the head at the last prompt token."""
    with active_adapter(model, adapter):
        hidden, last_prompt = forward_responses(model, prompt_ids, [[] for _ in prompt_ids], pad_id, "hidden", share_prefix,
                                                prefix)  # [n, W, H]
    last = hidden[torch.arange(len(prompt_ids), device=hidden.device), last_prompt]  # [n, H]
    return value_heads[adapter](last.float()).squeeze(-1).cpu()  # [n], on the CPU like the trainer's tables (head in float32)


def token_values(
    model: PeftModel,
    value_heads: torch.nn.ModuleDict,
    adapter: str,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    share_prefix: bool = True,
    prefix: SharedPrefix | None = None,
) -> torch.Tensor:
    """Token-level values V_φ(ô, w_<k) for k = 1 … K of each response, [n, L] (0 on padding).

    Column k is read at the position that predicts token k (prompt_len − 1 + k), so column 0 is
    the action-level value V_φ(ô) and the critic shares the policy's view of each token.
    """
    with active_adapter(model, adapter):
        hidden, last_prompt = forward_responses(model, prompt_ids, response_ids, pad_id, "hidden", share_prefix, prefix)  # [n, W, H]
    device = hidden.device
    longest = max(len(r) for r in response_ids)
    offsets = torch.arange(longest, device=device)
    positions = (last_prompt.unsqueeze(1) + offsets).clamp(max=hidden.shape[1] - 1)  # [n, L]
    gathered = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # [n, L, H]
    mask = (offsets.unsqueeze(0) < torch.tensor([len(r) for r in response_ids], device=device).unsqueeze(1)).float()
    return (value_heads[adapter](gathered.float()).squeeze(-1) * mask).cpu()


def decision_values(model: PeftModel, value_heads: torch.nn.ModuleDict, adapter: str, prompt_ids: list[list[int]],
                    response_ids: list[list[int]], pad_id: int, level: str, share_prefix: bool = True,
                    prefix: SharedPrefix | None = None) -> torch.Tensor:
    """V_φ per decision, [n, L] like `agents.policy_logprobs`: V(ô) at the action level (L = 1),
    V(ô, w_<k) at the token level (L = the longest response). share_prefix: the batch's common
    prompt prefix is run once (`agents.forward_responses`), or `prefix` was run already for
    several passes (`agents.run_shared_prefix`)."""
    if level == "token":
        return token_values(model, value_heads, adapter, prompt_ids, response_ids, pad_id, share_prefix, prefix)
    return action_values(model, value_heads, adapter, prompt_ids, pad_id, share_prefix, prefix).unsqueeze(-1)


def critic_parameters(model: PeftModel, value_heads: torch.nn.ModuleDict, adapter: str) -> list[torch.nn.Parameter]:
    """φ: the critic adapter's LoRA weights and its head (what the critic optimiser owns)."""
    return adapter_parameters(model, adapter) + list(value_heads[adapter].parameters())
