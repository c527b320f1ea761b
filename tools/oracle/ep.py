"""Expert parallelism for the oracle (MoE models, e.g. Mixtral).

--ep-impl hf: transformers' own implementation (transformers/distributed/tensor_parallel.py,
  5.17): `config.distributed_config = DistributedConfig(tp_size=ep, enable_expert_parallel=True)`
  makes `model.tp_plan` return the model's `base_model_ep_plan`, and
  `apply_tensor_parallelism(model, ep_mesh)` applies it. For Mixtral:
    layers.*.mlp.gate                    ep_router      (EpRouterParallel)
    layers.*.mlp.experts.gate_up_proj    grouped_gemm   (MoEParamShard(Shard(0)): E/ep experts)
    layers.*.mlp.experts.down_proj       grouped_gemm
    layers.*.mlp.experts                 moe_tp_experts (MoeExpertsParallel)
  The router runs replicated on every rank; routing slots that belong to other ranks' experts
  become a sentinel (score 0, index = num_local_experts) that the grouped_mm experts forward
  sorts to the tail and skips; the experts' output is all-reduced (sum) over the EP group.
  There is no all-to-all: every EP rank sees the same tokens (the EP group is a tensor-parallel
  group for the experts only; attention, embedding and norms are replicated).
"""
import torch


def apply_ep(model, mesh, impl):
    if impl == "hf":
        from transformers.distributed.configuration_utils import DistributedConfig
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism
        if not getattr(model.config, "base_model_ep_plan", None):
            raise SystemExit(f"ep: {type(model).__name__} has no base_model_ep_plan")
        model.config.distributed_config = DistributedConfig(tp_size=mesh.size(),
                                                            enable_expert_parallel=True)
        apply_tensor_parallelism(model, mesh)
        return model
    import ep_titan
    return ep_titan.apply(model, mesh)
