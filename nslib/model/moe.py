"""Mixture of experts for the tracer: a fixed routing in place of the data-dependent one.

Switch Transformer: routing is data-dependent, which meta tensors cannot
run, so each sparse MLP is replaced (on the traced instance only) by a fixed-capacity version as
in the measured runs: router linear + softmax + argmax, then each of the ``num_experts`` experts
processes ``expert_capacity`` tokens per batch row (the original opgraph shows
``Linear (64*batch, 1024, 16384)`` per expert): a gather of that token block, the expert's
MLP, a scale by the router probability and a scatter-add back. Top-k mixture of experts
(Mixtral, Qwen2-MoE, DeepSeek-V2/V3: experts stored as 3-D ``gate_up_proj``/``down_proj``):
the router runs as written (GEMM, softmax, top-k); the experts module is replaced by the eager
per-expert loop of transformers with a fixed routing, :func:`expert_tokens` tokens per expert
(balanced by default, ``imbalance`` skews it); shared experts run as written.
"""
from __future__ import annotations

import math
import types

__all__ = ["expert_tokens", "patch_moe"]


def _fixed_capacity_moe(self, hidden_states, *args, **kwargs):
    """A Switch sparse MLP with fixed-size expert blocks (see the module doc)."""
    import torch
    import torch.nn.functional as F

    router, experts = self.router, self.experts
    batch, seq, dim = hidden_states.shape
    h = hidden_states
    jitter = getattr(router, "jitter_noise", 0.0) or 0.0
    if self.training and jitter > 0:
        h = h * torch.empty_like(h).uniform_(1.0 - jitter, 1.0 + jitter)
    logits = router.classifier(h)
    probs = F.softmax(logits, dim=-1)
    route_prob, _ = probs.max(dim=-1)           # router probability of the chosen expert
    _chosen = probs.argmax(dim=-1)               # the routing decision (data-dependent)
    n_exp = int(getattr(router, "num_experts", len(experts)))
    cap = min(int(getattr(router, "expert_capacity", seq)), seq) * batch
    flat = hidden_states.reshape(batch * seq, dim)
    weight = route_prob.reshape(batch * seq, 1)
    out = torch.zeros_like(flat)
    names = [f"expert_{i}" for i in range(n_exp)]
    for name in names:
        # token positions routed to this expert: a fixed-size block of `cap` tokens
        idx = torch.empty(cap, dtype=torch.long, device=flat.device)
        tokens = flat.index_select(0, idx)
        y = experts[name](tokens) * weight.index_select(0, idx)
        out.index_add_(0, idx, y)
    return out.reshape(batch, seq, dim)


def expert_tokens(tokens: int, top_k: int, n_experts: int, imbalance: float = 1.0) -> list[int]:
    """Tokens each routed expert processes in one MoE layer (the tracer's routing assumption).

    ``tokens * top_k`` token-expert pairs are shared out: with ``imbalance = 1`` evenly (the
    first ``remainder`` experts take one more); with ``imbalance = f > 1`` the busiest expert
    takes ``f`` times the even share (at most every token once) and the others share the rest
    evenly. The total is always ``tokens * top_k``, so the GEMM FLOPs do not change; only the
    kernel shapes do (one large expert GEMM and many small ones).
    """
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) \
            or not math.isfinite(imbalance) or imbalance < 1:
        raise ValueError(f"imbalance must be a finite number >= 1 (1 = tokens spread evenly over "
                         f"the experts; 2 = the busiest expert gets twice its share), got "
                         f"{imbalance!r}")
    total = tokens * top_k
    top = min(tokens, math.ceil(imbalance * total / n_experts)) if imbalance > 1 else None
    if top is None or n_experts == 1:
        q, r = divmod(total, n_experts)
        return [q + 1] * r + [q] * (n_experts - r)
    q, r = divmod(total - top, n_experts - 1)
    return [top] + [q + 1] * r + [q] * (n_experts - 1 - r)


def _balanced_experts(self, hidden_states, top_k_index, top_k_weights):
    """A transformers experts module (3-D ``gate_up_proj``/``down_proj``) with a fixed routing.

    Each expert runs, as the eager loop of transformers does, a gather of its tokens, the
    gate-up GEMM, the activation times up, the down GEMM, a scale by the router weight and a
    scatter-add back; how many tokens each gets is :func:`expert_tokens`.
    """
    import torch
    import torch.nn.functional as F

    tokens = int(hidden_states.shape[0])
    counts = expert_tokens(tokens, int(top_k_index.shape[-1]), int(self.gate_up_proj.shape[0]),
                           self._nslib_imbalance)
    out = torch.zeros_like(hidden_states)
    weights = top_k_weights.reshape(-1, 1)
    for e, n in enumerate(counts):
        if n == 0:
            continue  # an expert no token reaches launches nothing
        idx = torch.empty(n, dtype=torch.long, device=hidden_states.device)
        gate, up = F.linear(hidden_states.index_select(0, idx), self.gate_up_proj[e]).chunk(2, -1)
        y = F.linear(self.act_fn(gate) * up, self.down_proj[e])
        out.index_add_(0, idx, y * weights.index_select(0, idx))
    return out


def _is_fused_experts(mod) -> bool:
    """Whether ``mod`` holds its experts as 3-D ``gate_up_proj``/``down_proj`` (Mixtral layout)."""
    w1, w2 = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return (getattr(w1, "dim", None) is not None and w1.dim() == 3
            and getattr(w2, "dim", None) is not None and w2.dim() == 3 and hasattr(mod, "act_fn"))


def patch_moe(model, imbalance: float = 1.0, arch: str = "model") -> int:
    """Give every mixture-of-experts module a fixed routing; returns how many were patched.

    Switch sparse MLPs get :func:`_fixed_capacity_moe`; top-k experts modules of the Mixtral
    layout (Mixtral, Qwen2-MoE, DeepSeek-V2/V3, ...) :func:`_balanced_experts`. Any other
    module named ``...Experts`` raises ValueError: its routing would need meta-unfriendly data.
    """
    n, done, top_k = 0, [], 0
    for name, mod in model.named_modules():
        cname = type(mod).__name__
        if any(name.startswith(d + ".") for d in done):
            continue  # inside a patched module: its own forward no longer runs them
        if cname.endswith("SparseMLP") and hasattr(mod, "router") and hasattr(mod, "experts"):
            mod.forward = types.MethodType(_fixed_capacity_moe, mod)
            n += 1
            done.append(name)
        elif _is_fused_experts(mod):
            mod._nslib_imbalance = imbalance
            mod.forward = types.MethodType(_balanced_experts, mod)
            n += 1
            top_k += 1
        elif cname.endswith("Experts"):
            raise ValueError(f"{arch}: the mixture-of-experts module {name} ({cname}) is not in a "
                             f"layout nslib can trace (it needs 3-D gate_up_proj/down_proj "
                             f"expert weights as in Mixtral, Qwen2-MoE and DeepSeek, or a Switch "
                             f"SparseMLP); this architecture is not supported yet")
    if imbalance != 1.0 and not top_k:
        raise ValueError(f"{arch}: imbalance applies to top-k mixture-of-experts layers "
                         f"(Mixtral, Qwen2-MoE, DeepSeek), and this model has none"
                         f"{' (Switch keeps a fixed expert capacity)' if n else ''}: drop "
                         f"the imbalance")
    return n
