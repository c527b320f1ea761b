"""torchtitan's expert parallelism (all-to-all token dispatch / combine), re-implemented for the
oracle on HF Mixtral-style models. This is torchtitan's scheme, NOT an upstream PyTorch or
transformers API: it follows torchtitan's `models/common/moe.py` (MoE, TokenChoiceTopKRouter,
GroupedExperts) and `models/common/token_dispatcher.py` (AllToAllTokenDispatcher) as of
pytorch/torchtitan b5bcd76 (2026-08-21), op for op where memory is concerned:

  router   gate linear in fp32 (torchtitan runs it under autocast(float32): x and the gate
           weight are cast to fp32 and saved), softmax (fp32), top-k, gather, renormalise
           (Mixtral's routing = score_func "softmax" + route_norm); expert_bias (fp32 (E,),
           load_balance_coeff 1e-3) added for the choice; tokens_per_expert accumulated
  dispatch argsort the T*K routing slots by expert, gather the token rows (N=T*K, D); exchange
           counts (all-to-all of (ep, E/ep) int64); all_to_all_single_autograd of the rows to
           the experts' owners (R rows); permute rank-major -> expert-major (index gather)
  experts  torch._grouped_mm over the local experts: silu(x @ w1^T) * (x @ w3^T) @ w2^T (bf16)
  combine  un-permute (new_empty + index_put), all_to_all_single_autograd back (N, D), fp32
           multiply by the routing scores, back to bf16, deterministic scatter_add (a custom op
           with torchtitan's backward: gather) into zeros (T, D)

Each EP rank processes its own micro-batch (EP ranks are data-parallel ranks for everything
but the experts), holds E/ep experts (w1, w3: (E/ep, F, D), w2: (E/ep, D, F)) and a full copy
of every other weight. Routing is assumed perfectly balanced: the fake process group carries
no token counts, so each rank sends N/ep rows to every rank and receives R = N rows (a real
run's R varies with the router). The dense weights' gradient reduction (FSDP / DDP) is not
applied here; take those terms from the fsdp / ddp cases.
"""
import torch
import torch.nn.functional as F
from torch import nn


@torch.library.custom_op("oracle_titan::deterministic_scatter_add", mutates_args=())
def deterministic_scatter_add(out: torch.Tensor, index: torch.Tensor,
                              src: torch.Tensor) -> torch.Tensor:
    return out.scatter_add(dim=0, index=index, src=src)


@deterministic_scatter_add.register_fake
def _(out, index, src):
    return torch.empty_like(out)


def _sa_backward(ctx, grad_output):
    (index,) = ctx.saved_tensors
    return grad_output, None, torch.gather(grad_output, dim=0, index=index)


def _sa_setup(ctx, inputs, output):
    _out, index, _src = inputs
    ctx.save_for_backward(index)


deterministic_scatter_add.register_autograd(_sa_backward, setup_context=_sa_setup)


class TitanMoE(nn.Module):
    def __init__(self, hf_moe, mesh, dtype, device):
        super().__init__()
        ex = hf_moe.experts
        E, D = ex.num_experts, ex.hidden_dim
        Fh = ex.intermediate_dim
        self.ep = mesh.size()
        self.mesh = mesh
        self.group = mesh.get_group()
        assert E % self.ep == 0, f"ep: {E} experts not divisible by ep {self.ep}"
        self.E, self.e, self.top_k = E, E // self.ep, hf_moe.top_k
        self.gate = nn.Parameter(torch.empty(E, D, dtype=dtype, device=device))
        self.w1 = nn.Parameter(torch.empty(self.e, Fh, D, dtype=dtype, device=device))
        self.w2 = nn.Parameter(torch.empty(self.e, D, Fh, dtype=dtype, device=device))
        self.w3 = nn.Parameter(torch.empty(self.e, Fh, D, dtype=dtype, device=device))
        self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32, device=device))
        self.register_buffer("tokens_per_expert", torch.zeros(E, dtype=torch.float32,
                                                              device=device), persistent=False)

    # -- router (TokenChoiceTopKRouter: softmax, route_norm) ------------------------------------
    def router(self, x):
        scores = F.linear(x.float(), self.gate.float())  # autocast(float32) on CUDA
        scores = F.softmax(scores, dim=-1)
        _, ids = torch.topk(scores + self.expert_bias, k=self.top_k, dim=-1, sorted=False)
        top = scores.gather(dim=-1, index=ids)
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return top, ids, scores

    def forward(self, hidden_states):
        B, S, D = hidden_states.shape
        x = hidden_states.view(-1, D)
        top, ids, scores = self.router(x)
        routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, ids, True)
        n_local = routing_map.sum(dim=0)
        with torch.no_grad():
            self.tokens_per_expert.add_(n_local)
        # dispatch: _local_reorder
        order = torch.argsort(ids.view(-1), stable=True)
        top_sorted = top.view(-1)[order]
        tok = order // self.top_k
        routed = x[tok]                                   # (N, D)
        N = routed.shape[0]
        # token-count exchange (all-to-all of (ep, e)); balanced splits (see module doc)
        from torch.distributed._functional_collectives import (all_to_all_single,
                                                               all_to_all_single_autograd)
        with torch.no_grad():
            n_global = all_to_all_single(n_local.view(self.ep, -1), None, None, group=self.mesh)
            n_global = torch.ops._c10d_functional.wait_tensor(n_global).reshape(-1)
        splits = [N // self.ep] * self.ep
        routed = all_to_all_single_autograd(routed, splits, splits, self.mesh)   # (R, D)
        # _permute: rank-major -> expert-major
        R = routed.shape[0]
        t_mat = n_global.view(self.ep, self.e)
        starts = (n_global.cumsum(0) - n_global).view(self.ep, self.e)
        seg_lens = t_mat.t().reshape(-1)
        starts = starts.t().reshape(-1)
        seg_ids = torch.arange(seg_lens.shape[0], device=x.device).repeat_interleave(
            seg_lens, output_size=R)
        out_starts = seg_lens.cumsum(0) - seg_lens
        perm = starts[seg_ids] + torch.arange(seg_ids.shape[0], device=x.device) - out_starts[seg_ids]
        n_per_local = t_mat.sum(0)
        in_shape = routed.shape
        routed = routed[perm, :]
        # GroupedExperts
        offs = torch.cumsum(n_per_local, dim=0, dtype=torch.int32)
        a = routed.bfloat16()
        h = F.silu(torch._grouped_mm(a, self.w1.bfloat16().transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(a, self.w3.bfloat16().transpose(-2, -1), offs=offs)
        y = torch._grouped_mm(h, self.w2.bfloat16().transpose(-2, -1), offs=offs).type_as(routed)
        # combine: _unpermute, all-to-all back, score, scatter_add
        un = y.new_empty(in_shape)
        un[perm, :] = y
        back = all_to_all_single_autograd(un, splits, splits, self.mesh)        # (N, D)
        back = (back.to(torch.float32) * top_sorted.reshape(-1, 1)).to(back.dtype)
        out = torch.zeros_like(x)
        out = deterministic_scatter_add(out, tok.reshape(-1, 1).expand(-1, D), back)
        return out.view(B, S, D)


def apply(model, mesh):
    """Swap every MixtralSparseMoeBlock for torchtitan's MoE with EP over `mesh`."""
    n = 0
    for layer in model.model.layers:
        moe = layer.mlp
        if not hasattr(moe, "experts"):
            continue
        p = next(moe.parameters())
        layer.mlp = TitanMoE(moe, mesh, p.dtype, p.device)
        n += 1
    if n == 0:
        raise SystemExit("ep titan: no MoE block found (layer.mlp.experts)")
    return model
