"""Ling-style Mixture-of-Experts language model (moe.md).

The training loop's interface:

    model = MoEModel(config)                      # config: MoEConfig (engine.moe.config)
    out = model(input_ids, labels)                # LongTensor [B, T] each; labels[:, t] is the
                                                  # token after input_ids[:, t], -100 = ignore
    out.loss.backward()                           # CE + mtp_w*CE_mtp + z_coef*sum(z)
                                                  #    + aux_coef*sum(aux)
    out.ce_loss                                   # main-head CE, nats/token, detached
    model(input_ids, labels, return_logits=True).logits   # [B, T, V]

    counts = model.routing_counts()               # [n_moe_layers, E] fp32, tokens routed per
                                                  # expert by training forwards since the reset
    # all-reduce(SUM) counts over data-parallel ranks, then once per optimizer step:
    model.update_expert_bias(counts)              # ling2 aux-loss-free update; no-op otherwise
    model.expert_stats(counts)                    # list of dicts, one per MoE layer: the
                                                  # `experts` event
    model.reset_routing_counts()
    model.set_step(step)                          # Stochastic Routing Warmup (ling1)

    param_count(config, active=False)             # from the config alone (no torch)
    cast_parameters(model.cuda(), torch.bfloat16) # bf16 weights, fp32 routing state (GPU)

MoE layers are ordered as the decoder's MoE layers, then the MTP layers'. MTP runs only in
training mode (`model.train()`); `ce_loss` never includes it.
"""

from engine.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "config": ("MoEConfig", "PRESETS", "param_count", "preset"),
    "model": ("ModelOutput", "MoEModel", "cast_parameters"),
})
