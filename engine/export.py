"""Export a checkpoint as a Hugging Face `Glm4MoeForCausalLM` directory, and load one back.

    python -m engine.export CHECKPOINT OUT_DIR [--spec SPEC.json] [--max-shard-size 5GB]

writes `config.json`, `generation_config.json`, `model.safetensors` (or shards and
`model.safetensors.index.json` above the shard size), the tokenizer files when the run used
a `tokenizer.json`, and a README saying what was exported and what was left out. Glm4Moe
ships inside transformers and has our ling2 blocks: sigmoid router with an expert bias
(`e_score_correction_bias`), group-limited top-k, shared experts, first-k dense layers,
partial RoPE and QK-norm. What it cannot represent exactly is refused, naming the field.

The checkpoint is read with the engine's reshard-on-load reader into this one process, from
any PaRO layout and world size, one tensor at a time: every Hugging Face tensor is one
contiguous range of the flat `params` buffer (parameters in `model.parameters()` order, no
padding), so peak memory is about one safetensors shard plus one tensor. The weights are
written as `save_pretrained` writes them (one tensor per expert), so other tools read them.

`load_hf(model_dir, config)` is the inverse: a directory in that form (ours, or any
`Glm4MoeForCausalLM.save_pretrained` with a matching config) to an `MoEModel` state dict.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import safe_open
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

from engine.checkpoint import CheckpointError, CheckpointInfo, CheckpointReader
from engine.checkpoint.reader import resolve
from engine.errors import SpecError
from engine.moe.config import MoEConfig
from engine.moe.model import MoEModel
from engine.runtime.confine import open_confined

if TYPE_CHECKING:
    from engine.runtime.spec import JobSpec

ARCHITECTURE = "Glm4MoeForCausalLM"
INDEX_FILE = "model.safetensors.index.json"
LINEAGE_KEY = "ringside_lineage"  # config.json's: what made the model (engine.runtime.lineage)


class ExportError(ValueError):
    """The model or the directory cannot be converted; the message names the field or tensor."""


# --- what Glm4Moe can represent ------------------------------------------------------------


def refuse_unrepresentable(config: MoEConfig) -> None:
    """Raise ExportError naming the first MoEConfig feature that Glm4Moe would change.

    Everything else either maps exactly or only shapes training (loss coefficients, bias
    update rate, initialisation, dispatch implementation, MTP), which the README lists."""
    if config.router_mode != "ling2" or config.score_function != "sigmoid":
        raise ExportError(
            f"model.router_mode: the {config.router_mode} router ({config.score_function} "
            "top-k, balanced by an auxiliary loss and Stochastic Routing Warmup) cannot be "
            "represented by Glm4Moe, whose router is sigmoid scores plus an expert bias"
        )
    if config.use_bias:
        raise ExportError(
            "model.use_bias: a bias on the attention output projection cannot be represented "
            "by Glm4Moe (its o_proj has none)"
        )
    if config.norm_head and config.tie_word_embeddings:
        raise ExportError(
            "model.norm_head: NormHead with tied embeddings cannot be represented by Glm4Moe "
            "(the folded head would no longer equal the embedding matrix)"
        )
    if config.num_experts < 2 or config.num_experts // config.n_group < 2:
        raise ExportError(
            "model.num_experts: Glm4Moe's router ranks groups by their two best experts, so it "
            "cannot represent groups of fewer than 2 experts"
        )


def glm4moe_config(config: MoEConfig) -> Any:
    """The `Glm4MoeConfig` whose model computes what `MoEModel(config)` computes at inference."""
    from transformers import Glm4MoeConfig

    refuse_unrepresentable(config)
    c = config
    return Glm4MoeConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, hidden_act="silu",
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        initializer_range=c.initializer_range, tie_word_embeddings=c.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta,
                         "partial_rotary_factor": c.partial_rotary_factor},
        attention_bias=c.use_qkv_bias, use_qk_norm=c.use_qk_norm,
        moe_intermediate_size=c.moe_intermediate_size, num_experts_per_tok=c.num_experts_per_tok,
        n_shared_experts=c.num_shared_experts, n_routed_experts=c.num_experts,
        routed_scaling_factor=c.routed_scaling_factor, n_group=c.n_group,
        topk_group=c.topk_group, first_k_dense_replace=c.first_k_dense_replace,
        # our router skips the renormalisation at k = 1 (the weight stays the raw score);
        # Glm4Moe's would make it 1
        norm_topk_prob=c.norm_topk_prob and c.num_experts_per_tok > 1,
        num_mtp_layers=0, architectures=[ARCHITECTURE], dtype="float32",
    )


# --- the name mapping ------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One Hugging Face tensor: elements [start, start + numel) of our tensor `source`."""

    hf_name: str
    shape: tuple[int, ...]
    source: str  # our parameter or buffer name
    start: int = 0
    norm_head: bool = False  # fold NormHead: W / (column norm of W + 1e-7)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_RENAMES = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.dense.weight": "self_attn.o_proj.weight",
    "attention.query_norm.weight": "self_attn.q_norm.weight",
    "attention.key_norm.weight": "self_attn.k_norm.weight",
    "ffn.router.weight": "mlp.gate.weight",
    "ffn.router.expert_bias": "mlp.gate.e_score_correction_bias",
    **{f"ffn.{p}.weight": f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")},
    **{f"ffn.shared.{p}.weight": f"mlp.shared_experts.{p}.weight"
       for p in ("gate_proj", "up_proj", "down_proj")},
}


def _pieces_of(name: str, shape: tuple[int, ...], c: MoEConfig) -> list[Piece]:
    """The Hugging Face tensors that our tensor `name` becomes (none for MTP layers)."""
    if name in ("embed_tokens.weight", "norm.weight"):
        return [Piece(f"model.{name}", shape, name)]
    if name == "lm_head.weight":
        return [Piece(name, shape, name, norm_head=c.norm_head)]
    if name.startswith("mtp."):
        return []
    _, layer, rest = name.split(".", 2)
    prefix = f"model.layers.{layer}."
    if rest.startswith("attention.query_key_value."):
        kind = rest.rsplit(".", 1)[1]  # weight or bias: rows q (H*hd), k, v (KV*hd each)
        rows = [c.num_attention_heads * c.head_dim] + [c.num_key_value_heads * c.head_dim] * 2
        width = math.prod(shape[1:])
        starts = [0, rows[0] * width, (rows[0] + rows[1]) * width]
        return [Piece(f"{prefix}self_attn.{p}_proj.{kind}", (r, *shape[1:]), name, s)
                for p, r, s in zip("qkv", rows, starts, strict=True)]
    if rest == "ffn.experts.gate_up":  # [E, 2f, d], gate rows first
        e, two_f, d = shape
        f = two_f // 2
        return [Piece(f"{prefix}mlp.experts.{i}.{p}.weight", (f, d), name, (2 * i + j) * f * d)
                for i in range(e) for j, p in enumerate(("gate_proj", "up_proj"))]
    if rest == "ffn.experts.down":  # [E, d, f]
        e, d, f = shape
        return [Piece(f"{prefix}mlp.experts.{i}.down_proj.weight", (d, f), name, i * d * f)
                for i in range(e)]
    if rest not in _RENAMES:
        raise ExportError(f"{name}: no Glm4Moe equivalent (this exporter does not know it)")
    return [Piece(prefix + _RENAMES[rest], shape, name)]


class _NoNormalInit(TorchFunctionMode):
    """`normal_` (the tensor's and torch.nn.init's) as a no-op. On the meta device there are
    no values to draw, and `normal_`, which has no meta kernel, runs its Python reference,
    whose first call imports torch._dynamo: 5 s of CPU in every process that reads a layout
    (an export, an evaluation, an `init_from`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.nn.init.normal_, torch.Tensor.normal_):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def model_layout(config: MoEConfig) -> tuple[dict[str, tuple[int, tuple[int, ...]]],
                                             dict[str, tuple[int, ...]]]:
    """Our parameters {name: (offset in the flat buffer, shape)} in `model.parameters()`
    order, and our persistent buffers {name: shape}; built on the meta device (no memory)."""
    with torch.device("meta"), _NoNormalInit():
        model = MoEModel(config)
    params, offset = {}, 0
    for name, p in model.named_parameters():
        params[name] = (offset, tuple(p.shape))
        offset += p.numel()
    names = set(params)
    buffers = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in names
               and not k.startswith("lm_head.")}  # a tied head is the embedding, not a buffer
    return params, buffers


def hf_pieces(config: MoEConfig) -> list[Piece]:
    """Every tensor of the Glm4Moe checkpoint, in our model's order."""
    params, buffers = model_layout(config)
    shapes = {name: shape for name, (_, shape) in params.items()} | buffers
    return [piece for name, shape in shapes.items() for piece in _pieces_of(name, shape, config)]


# --- reading the checkpoint --------------------------------------------------------------


def checkpoint_buffers(reader: CheckpointReader) -> dict[str, torch.Tensor]:
    """The model's replicated buffers (the MoE expert bias) from rank 0's extras: in the
    trainer's `train` part, or at the top of the flat extras of checkpoints written before
    the extras held named parts."""
    extras = reader.extras(0)
    state = extras.get("train", extras) if isinstance(extras, dict) else {}
    if "buffers" not in state:
        raise ExportError(f"{reader.info.path}: its extras hold no model buffers")
    return state["buffers"]


def _check_checkpoint(reader: CheckpointReader, params: dict) -> None:
    saved = reader.tensors.get("params", {}).get("length")
    wanted = sum(math.prod(shape) for _, shape in params.values())
    if saved != wanted:
        raise ExportError(
            f"{reader.info.path}: the checkpoint holds {saved} parameters, the spec's model "
            f"{wanted}: is this the spec the run trained with?"
        )


def _read_piece(reader: CheckpointReader, piece: Piece, params: dict,
                buffers: dict[str, torch.Tensor]) -> torch.Tensor:
    if piece.source in buffers:
        return buffers[piece.source].float().reshape(piece.shape).clone()
    if piece.source not in params:
        raise ExportError(f"{reader.info.path}: its extras lack the buffer {piece.source}")
    offset, _ = params[piece.source]
    tensor = reader.read("params", offset + piece.start, piece.numel).view(piece.shape)
    if piece.norm_head:  # as LMHead.forward computes it, so the logits are the same
        tensor = tensor / (tensor.norm(dim=0, keepdim=True) + 1e-7)
    return tensor


# --- export ----------------------------------------------------------------------------------


def export(checkpoint: str | os.PathLike[str], out_dir: str | os.PathLike[str], spec: JobSpec,
           *, max_shard_size: int | str = "5GB") -> dict[str, Any]:
    """Write the Hugging Face directory for `checkpoint` (a step folder, or a checkpoint
    directory: its newest good checkpoint), trained by `spec` (a JobSpec). Returns a
    summary: files written, tensors, bytes, shards."""
    config: MoEConfig = spec.model
    hf_config = glm4moe_config(config)  # refuses what Glm4Moe cannot represent, first
    info = resolve(checkpoint)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("model*.safetensors*"):  # an earlier export's shards would mislead
        stale.unlink()
    params, _ = model_layout(config)
    pieces = hf_pieces(config)
    with CheckpointReader(info) as reader:
        _check_checkpoint(reader, params)
        buffers = checkpoint_buffers(reader)
        if not config.moe_router_enable_expert_bias:  # our router never adds it
            buffers = {k: torch.zeros_like(v) for k, v in buffers.items()}
        shards = _write_weights(reader, pieces, params, buffers, out, max_shard_size)
    hf_config.save_pretrained(out)
    lineage = _add_lineage(out, info)
    _generation_config(hf_config).save_pretrained(out)
    tokenizer = _write_tokenizer(spec, out)
    summary = {
        "checkpoint": str(info.path), "step": info.step, "strategy": info.strategy,
        "world_size": info.world_size, "out_dir": str(out), "architecture": ARCHITECTURE,
        "tensors": len(pieces), "parameters": sum(p.numel for p in pieces),
        "bytes": sum(p.numel * 4 for p in pieces), "shards": shards, "tokenizer": tokenizer,
    }
    (out / "README.md").write_text(_readme(spec, summary) + _lineage_section(lineage))
    return summary


def _add_lineage(out: Path, info: CheckpointInfo) -> dict[str, Any] | None:
    """The checkpoint's lineage into config.json (LINEAGE_KEY); None for a checkpoint saved
    before lineages were recorded."""
    lineage = info.meta.get("lineage")
    if lineage is None:
        return None
    lineage = {**lineage, "checkpoint": str(info.path)}
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, LINEAGE_KEY: lineage}, indent=2,
                                                sort_keys=True) + "\n")
    return lineage


def exported_lineage(model_dir: Path) -> dict[str, Any] | None:
    """The lineage a Ringside export's config.json carries; None for any other folder."""
    return json.loads((model_dir / "config.json").read_text()).get(LINEAGE_KEY)


def _lineage_section(lineage: dict[str, Any] | None) -> str:
    if lineage is None:
        return "## Lineage\n\nNot recorded: the checkpoint predates lineage records.\n"
    sources = [f"- source `{s['name']}`: {s['tokens']:,} tokens trained on; dataset manifest "
               f"sha256 `{s['manifest_sha256'] or 'none (in memory)'}`, tokenizer sha256 "
               f"`{s['tokenizer_sha256'] or 'none'}`" for s in lineage["sources"]]
    parents = [f"{i}. {p['kind']} from `{p['path']}`"
               + (f" (step {p['step']})" if p["step"] is not None else "")
               for i, p in enumerate(lineage["parents"], 1)]
    return "\n".join([
        "## Lineage",
        "",
        f"What made this model (also in `config.json` under `{LINEAGE_KEY}`):",
        "",
        f"- checkpoint `{lineage['checkpoint']}`, step {lineage['step']}",
        f"- code version `{lineage['code_version']}`",
        f"- job spec sha256 `{lineage['spec_sha256']}`",
        *sources,
        "",
        "Parents, newest first:" if parents else "No parent: trained from scratch.",
        "",
        *parents,
        "",
    ])


def _write_weights(reader: CheckpointReader, pieces: list[Piece], params: dict,
                   buffers: dict[str, torch.Tensor], out: Path,
                   max_shard_size: int | str) -> list[str]:
    """Write the safetensors shards one at a time, each filled tensor by tensor from the
    checkpoint, as transformers' `save_pretrained` names and indexes them."""
    by_name = {p.hf_name: p for p in pieces}
    # the plan only needs sizes: meta tensors hold none
    plan = split_torch_state_dict_into_shards(
        {p.hf_name: torch.empty(p.shape, device="meta") for p in pieces},
        max_shard_size=max_shard_size,
    )
    for filename, names in plan.filename_to_tensors.items():
        shard = {name: _read_piece(reader, by_name[name], params, buffers) for name in names}
        save_file(shard, out / filename, metadata={"format": "pt"})
        del shard
    if plan.is_sharded:
        index = {"metadata": {**plan.metadata, "total_parameters": sum(p.numel for p in pieces)},
                 "weight_map": plan.tensor_to_filename}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return list(plan.filename_to_tensors)


def _generation_config(hf_config: Any) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig.from_model_config(hf_config)


def _write_tokenizer(spec: JobSpec, out: Path) -> str | None:
    """The run's tokenizer as transformers loads it (`AutoTokenizer.from_pretrained`), or
    None for byte-level runs, whose token ids are the UTF-8 bytes themselves. It is read
    under the run's data roots, as the run read it."""
    tokenizer = spec.train.dataset.tokenizer
    if tokenizer == "bytes":
        return None
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    field = "train.dataset.tokenizer"
    try:
        with open_confined(tokenizer, spec.data.roots, field) as f:
            text = f.read().decode("utf-8", errors="replace")
    except SpecError as e:
        raise ExportError(str(e)) from e
    except OSError as e:
        raise ExportError(f"{field}: no tokenizer file at {tokenizer!r}") from e
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(text)).save_pretrained(out)
    return tokenizer


_TRAINING_ONLY = (
    "z_loss_coef aux_loss_coef bias_update_rate bias_zero_mean mtp_loss_scaling_factor "
    "srw_warmup_steps initializer_range init_scaled_out moe_impl"
).split()


def _readme(spec: JobSpec, s: dict[str, Any]) -> str:
    c: MoEConfig = spec.model
    mtp = c.num_nextn_predict_layers
    tokenizer = (
        f"The tokenizer the run used (`{s['tokenizer']}`) is included "
        "(`AutoTokenizer.from_pretrained` loads it)."
        if s["tokenizer"] else
        "No tokenizer files: the run was byte-level (`train.dataset.tokenizer: \"bytes\"`), so "
        "token ids are the UTF-8 bytes of the text (0-255); encode with "
        "`list(text.encode(\"utf-8\"))` and decode with `bytes(ids).decode(\"utf-8\", "
        "\"replace\")`."
    )
    training = ", ".join(f"`{name}={getattr(c, name)}`" for name in _TRAINING_ONLY)
    left_out = [
        f"- the {mtp} multi-token-prediction layer(s) (`num_nextn_predict_layers`): a training "
        "objective in Ringside, not used at inference; the config says `num_nextn_predict_layers:"
        " 0`." if mtp else "- no multi-token-prediction layers (the model has none).",
        "- the optimizer state (AdamW moments and step), the data position and the RNG: they "
        "resume training, not inference; resume from the checkpoint itself for that.",
        f"- training-only settings, which do not change the forward pass: {training}.",
    ]
    folded = (
        "NormHead is folded in: `lm_head.weight` is the head already divided by its column norms "
        "(+1e-7), as the engine computes it, so the logits are the same."
        if c.norm_head else "The head is a plain linear layer (no NormHead)."
    )
    return "\n".join([
        f"# {spec.name} (Ringside export)",
        "",
        f"A Ling-style Mixture-of-Experts language model trained with Ringside, exported as "
        f"`{ARCHITECTURE}` (model type `glm4_moe`, part of transformers: no `trust_remote_code`).",
        "",
        f"- from checkpoint `{s['checkpoint']}`, step {s['step']} (saved by {s['world_size']} "
        f"ranks, strategy {s['strategy'] or 'unknown'})",
        f"- {s['parameters']:,} parameters in {s['tensors']} tensors, float32, "
        f"{len(s['shards'])} safetensors file(s)",
        f"- {c.num_hidden_layers} layers ({c.first_k_dense_replace} dense), {c.num_experts} "
        f"routed experts ({c.num_experts_per_tok} per token, {c.n_group} groups, top "
        f"{c.topk_group}), {c.num_shared_experts} shared, hidden size {c.hidden_size}, "
        f"vocabulary {c.vocab_size}",
        "- the router's expert bias (aux-loss-free balancing) is "
        "`mlp.gate.e_score_correction_bias`; each expert's weights are stored separately, "
        "as `save_pretrained` writes them.",
        f"- {folded}",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        "model = AutoModelForCausalLM.from_pretrained(\"<this folder>\")",
        "```",
        "",
        "## Tokenizer",
        "",
        tokenizer,
        "",
        "## Left out",
        "",
        *left_out,
        "",
    ])


# --- loading a Hugging Face directory ------------------------------------------------------

# the config.json fields that change the forward pass without changing a tensor's shape
_FORWARD_FIELDS = (
    "model_type rms_norm_eps routed_scaling_factor n_group topk_group norm_topk_prob "
    "num_experts_per_tok first_k_dense_replace use_qk_norm tie_word_embeddings hidden_act"
).split()


def _check_hf_config(model_dir: Path, config: MoEConfig) -> None:
    found = json.loads((model_dir / "config.json").read_text())
    expected = glm4moe_config(config).to_dict()
    errors = [
        f"config.json {key}: expected {expected.get(key)!r}, found {found.get(key)!r}"
        for key in _FORWARD_FIELDS if found.get(key) != expected.get(key)
    ]
    rope, want = found.get("rope_parameters") or {}, expected["rope_parameters"]
    errors += [
        f"config.json rope_parameters.{key}: expected {want[key]!r}, found {rope.get(key)!r}"
        for key in ("rope_type", "rope_theta", "partial_rotary_factor")
        if rope.get(key) != want[key]
    ]
    if errors:
        raise ExportError(f"{model_dir} does not match the MoEConfig:\n  " + "\n  ".join(errors))


def _weight_files(model_dir: Path) -> dict[str, Path]:
    """{tensor name: safetensors file} from the index, or from the one model.safetensors."""
    if (model_dir / INDEX_FILE).exists():
        weight_map = json.loads((model_dir / INDEX_FILE).read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise ExportError(f"{model_dir}: neither model.safetensors nor {INDEX_FILE}")
    with safe_open(single, "pt") as f:
        return {name: single for name in f.keys()}


def load_hf(model_dir: str | os.PathLike[str], config: MoEConfig) -> dict[str, torch.Tensor]:
    """An `MoEModel(config)` state dict (fp32) from a Glm4Moe directory: every parameter and
    the expert biases, except the MTP layers', which Glm4Moe does not carry (load it with
    `strict=False`, or into a config with `num_nextn_predict_layers=0`).

    Raises ExportError listing every mismatch: a config.json field that changes the forward
    pass, and each tensor missing or of the wrong shape (name, expected, found)."""
    model_dir = Path(model_dir)
    _check_hf_config(model_dir, config)
    params, buffers = model_layout(config)
    shapes = {name: shape for name, (_, shape) in params.items()} | buffers
    pieces = hf_pieces(config)
    files = _weight_files(model_dir)
    errors = [f"{p.hf_name}: missing (expected shape {list(p.shape)})"
              for p in pieces if p.hf_name not in files]
    state = {name: torch.empty(shapes[name]) for name in {p.source for p in pieces}}
    for file in sorted({files[p.hf_name] for p in pieces if p.hf_name in files}):
        with safe_open(file, "pt") as f:
            for piece in (p for p in pieces if files.get(p.hf_name) == file):
                found = tuple(f.get_slice(piece.hf_name).get_shape())
                if found != piece.shape:
                    errors.append(f"{piece.hf_name}: expected shape {list(piece.shape)}, "
                                  f"found {list(found)}")
                    continue
                flat = state[piece.source].view(-1)[piece.start : piece.start + piece.numel]
                flat.copy_(f.get_tensor(piece.hf_name).view(-1))
    if errors:
        raise ExportError(f"{model_dir} does not fit the MoEConfig:\n  " + "\n  ".join(errors))
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state


# --- command line ----------------------------------------------------------------------------


def load_spec(spec_path: Path | None, checkpoint: str) -> JobSpec:
    """The job spec from --spec, else from the checkpoint's manifest meta (key "spec")."""
    from engine.runtime.spec import parse_spec

    if spec_path is not None:
        return parse_spec(json.loads(spec_path.read_text(encoding="utf-8")))
    meta = resolve(checkpoint).meta
    if "spec" not in meta:
        raise ExportError(f"{checkpoint}: the checkpoint does not record its job spec; pass "
                          "--spec with the spec the run trained with")
    return parse_spec(meta["spec"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.export",
        description="Export a Ringside checkpoint as a Hugging Face Glm4MoeForCausalLM folder.")
    parser.add_argument("checkpoint", help="a checkpoint step folder, or a checkpoint directory "
                                           "(its newest good checkpoint)")
    parser.add_argument("out_dir", type=Path, help="the folder to write")
    parser.add_argument("--spec", type=Path, help="the job spec the run trained with (JSON)")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="largest safetensors file, e.g. 5GB or 500MB (default 5GB)")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec, args.checkpoint)
        summary = export(args.checkpoint, args.out_dir, spec, max_shard_size=args.max_shard_size)
    except (ExportError, CheckpointError, OSError, ValueError) as e:  # SpecError: a ValueError
        print(f"export: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
