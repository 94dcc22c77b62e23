"""PaRO sharded data parallelism: ten strategies, their flat-buffer engine and a planner.

Reference: ../shared/specs/paro-horing.md. How the training loop uses it (every rank):

    topo = Topology.from_env().init_groups()
    dp = ShardedDataParallel(model, topo, "IIG", lr=3e-4, grad_accum=4, collective="native")
    for step in ...:
        for micro in range(4):
            out = dp.forward_backward(input_ids, labels)     # out.loss, out.ce_loss
        grad_norm = dp.step(lr=lr_at(step), grad_clip=1.0)   # global norm before clipping
        dp.state_bytes()  # {params, grads, optim}: bytes held by this rank
        dp.comm_stats()   # {intra_bytes, inter_bytes, intra_calls, inter_calls} of that step
    # model-side updates between steps (MoE expert bias) use dp.module's buffers, which are
    # replicated; parameters sharded at I or G are only materialised inside dp.full_parameters()

Checkpoints: `dp.sharded_state()` -> {"params" | "exp_avg" | "exp_avg_sq": (tensor, offset,
length)}: this rank's piece of each global flat buffer (parameters in `module.parameters()`
order, no padding), disjoint across ranks; save `dp.adam_step` alongside. Restore into any
strategy or world size with `dp.load_sharded_state(read)`, where `read(kind, offset, length)`
returns those global elements, then set `dp.adam_step`.

Optimizer: AdamW with torch's arithmetic on the owned shard, weight decay on matrices only
(ndim >= 2); fp32 parameters are their own master weights, other dtypes keep an fp32 copy.
Gradients are averaged over ranks; `step(lr, grad_clip)` clips on the global norm (grad_clip
<= 0: no clipping). Parameters must all be trainable and share one dtype and device.

Planner: `plan(model_config, topology, memory_budget_bytes, grad_accum, links, *, trainable,
compute_time_s, dtype_bytes, collective) -> list[PlanRow]` ranks every strategy (links:
engine.horing.cost.Links, measured by engine.horing.cost.calibrate); `python -m
engine.paro.plan --help` prints it as a table.
"""

from engine.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "layout": ("ShardLayout",),
    "planner": ("PlanRow", "plan"),
    "sharded": ("ShardedDataParallel",),
    "strategy": ("Strategy", "parse_strategy"),
})
