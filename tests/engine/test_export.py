"""engine.export: a checkpoint of any PaRO layout becomes a Hugging Face Glm4Moe folder that
transformers loads with no missing or unexpected weight and whose logits are the engine's;
load_hf brings such a folder (or any matching Glm4Moe save_pretrained) back into MoEModel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.moe_model import glm4moe_like
from engine.checkpoint import Checkpointer, CheckpointReader
from engine.checkpoint.reader import resolve
from engine.export import INDEX_FILE, ExportError, export, load_hf
from engine.moe.config import preset
from engine.moe.model import MoEModel
from engine.runtime.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"


def train_2x2(tmp_path: Path, model: dict, tokenizer: str = "bytes") -> tuple[Path, object]:
    """Run the engine CLI on 2 nodes x 2 ranks with a sharded strategy; its checkpoint, spec."""
    (tmp_path / "data.txt").write_text(TEXT * 200)
    data = {
        "name": "export-test", "model": model,
        "parallel": {"nodes": 2, "procs_per_node": 2, "strategy": "IIG"},
        "train": {"steps": 2, "micro_batch": 2, "seq_len": 32, "warmup": 1, "eval_every": 0,
                  "device": "cpu", "threads": 1,
                  "dataset": {"kind": "text", "paths": [str(tmp_path / "data.txt")],
                              "tokenizer": tokenizer}},
        "checkpoint": {"every": 0},
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(data))
    run = subprocess.run(
        [sys.executable, "-m", "engine.train", str(spec_path), "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return resolve(tmp_path / "run" / "checkpoints").path, parse_spec(data)


def engine_model(checkpoint: Path, config) -> MoEModel:
    """The engine's model from the checkpoint, independently of engine.export: the flat
    parameter buffer in model.parameters() order, the buffers from rank 0's extras."""
    model = MoEModel(config)
    with CheckpointReader(resolve(checkpoint)) as reader:
        flat = reader.read("params", 0, reader.tensors["params"]["length"])
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
        model.load_state_dict(reader.extras(0)["train"]["buffers"], strict=False)
    return model.eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(model, MoEModel):
            return model(ids, ids, return_logits=True).logits
        return model(input_ids=ids).logits


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def tokens(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))


def load_in_transformers(out: Path):
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and not info["error_msgs"]
    assert type(model).__name__ == "Glm4MoeForCausalLM"
    return model.eval()


def test_tiny_trained_on_2x2_ranks_exports_with_its_tokenizer_and_the_engines_logits(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe = trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"])  # < tiny's 256
    tokenizer.train_from_iterator([TEXT] * 10, bpe)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    checkpoint, spec = train_2x2(tmp_path, {"preset": "tiny", "num_hidden_layers": 2},
                                 tokenizer=str(tmp_path / "tokenizer.json"))
    assert spec.model.num_nextn_predict_layers == 1  # the MTP layer is trained, then left out

    summary = export(checkpoint, tmp_path / "hf", spec)

    out = tmp_path / "hf"
    assert summary["shards"] == ["model.safetensors"] and not (out / INDEX_FILE).exists()
    hf = load_in_transformers(out)
    ours = engine_model(checkpoint, spec.model)
    ids = tokens(spec.model.vocab_size)
    assert relative_error(logits(hf, ids), logits(ours, ids)) <= 1e-4
    with safe_open(out / "model.safetensors", "pt") as f:
        assert not any(".layers.2." in name or "mtp" in name for name in f.keys())
    readme = (out / "README.md").read_text()
    assert "multi-token-prediction" in readme and "tokenizer.json" in readme
    assert AutoTokenizer.from_pretrained(out).encode(TEXT) == tokenizer.encode(TEXT).ids

    # and back: the exported folder into a fresh engine model gives identical logits
    fresh = MoEModel(spec.model)
    result = fresh.load_state_dict(load_hf(out, spec.model), strict=False)
    assert result.unexpected_keys == [] and all(k.startswith("mtp.") for k in result.missing_keys)
    assert torch.equal(logits(fresh.eval(), ids), logits(ours, ids))


def test_small_trained_on_2x2_ranks_exports_in_shards_from_the_command_line(tmp_path):
    checkpoint, spec = train_2x2(
        tmp_path, {"preset": "small", "num_hidden_layers": 2, "num_nextn_predict_layers": 0})
    assert spec.model.hidden_size == preset("small").hidden_size

    # from the command line, with the spec the checkpoint carries
    out = tmp_path / "hf"
    cli = subprocess.run([sys.executable, "-m", "engine.export", str(checkpoint), str(out),
                          "--max-shard-size", "8MB"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert cli.returncode == 0, cli.stderr

    index = json.loads((out / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and sorted(p.name for p in out.glob("*.safetensors")) == shards
    assert all((out / shard).stat().st_size <= 8e6 + 1e5 for shard in shards)
    hf = load_in_transformers(out)
    ids = tokens(spec.model.vocab_size)
    ours = engine_model(checkpoint, spec.model)
    assert relative_error(logits(hf, ids), logits(ours, ids)) <= 1e-4
    assert not list(out.glob("tokenizer*"))
    assert "No tokenizer files" in (out / "README.md").read_text()
    assert {"config.json", "generation_config.json"} <= {p.name for p in out.iterdir()}


def save_single_rank_checkpoint(directory: Path, model: MoEModel, part: str = "") -> Path:
    """A one-rank checkpoint of `model` as the trainer lays it out: the flat parameters, and
    the buffers in the extras (under the stateful `part` when named, as a TrainState saves)."""
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    params = {name for name, _ in model.named_parameters()}
    extras = {"buffers": {k: v.clone() for k, v in model.state_dict().items() if k not in params}}
    ckpt = Checkpointer(directory, memory_dir=None)
    ckpt.save(1, {"params": (flat, 0, flat.numel())}, {part: extras} if part else extras)
    ckpt.close()
    return resolve(directory).path


def test_norm_head_is_folded_into_the_exported_head(tmp_path):
    config = preset("nano").replace(norm_head=True)
    torch.manual_seed(0)
    model = MoEModel(config).eval()
    for layer in model.moe_layers:  # a trained bias, so that it changes the routing
        layer.router.expert_bias.normal_(0, 0.05)
    spec = parse_spec({"name": "nh", "model": {"preset": "nano", "norm_head": True}})
    checkpoint = save_single_rank_checkpoint(tmp_path / "ckpt", model)

    export(checkpoint, tmp_path / "hf", spec)

    hf = load_in_transformers(tmp_path / "hf")
    head = model.lm_head.weight.detach()
    assert torch.equal(hf.lm_head.weight.detach(), head / (head.norm(dim=0, keepdim=True) + 1e-7))
    ids = tokens(config.vocab_size)
    assert relative_error(logits(hf, ids), logits(model, ids)) <= 1e-4
    assert "NormHead is folded in" in (tmp_path / "hf" / "README.md").read_text()


@pytest.mark.parametrize("part", ["train", ""])
def test_the_expert_bias_comes_from_the_train_state_or_older_flat_extras(tmp_path, part):
    torch.manual_seed(0)
    model = MoEModel(preset("nano"))
    model.moe_layers[0].router.expert_bias.normal_(0, 0.05)
    checkpoint = save_single_rank_checkpoint(tmp_path / "ckpt", model, part)

    export(checkpoint, tmp_path / "hf", parse_spec({"name": "b", "model": {"preset": "nano"}}))

    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        exported = f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias")
    assert torch.equal(exported, model.moe_layers[0].router.expert_bias)


@pytest.mark.parametrize("overrides, field", [
    ({"preset": "ling-lite"}, "model.router_mode"),
    ({"preset": "nano", "use_bias": True}, "model.use_bias"),
    ({"preset": "nano", "norm_head": True, "tie_word_embeddings": True}, "model.norm_head"),
])
def test_a_feature_glm4moe_cannot_represent_is_refused_by_name(tmp_path, overrides, field):
    spec = parse_spec({"name": "refused", "model": overrides})
    with pytest.raises(ExportError, match=f"^{field}: .* cannot be represented by Glm4Moe"):
        export(tmp_path / "no-checkpoint-needed", tmp_path / "hf", spec)
    assert not (tmp_path / "hf").exists()  # refused before anything is written


def test_the_command_line_refuses_with_the_field_and_exit_code_1(tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"name": "refused", "model": {"preset": "ling-lite"}}))
    cli = subprocess.run(
        [sys.executable, "-m", "engine.export", str(tmp_path / "ckpt"), str(tmp_path / "hf"),
         "--spec", str(spec_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1
    assert cli.stderr.startswith("export: model.router_mode: the ling1 router (softmax")


def test_a_random_glm4moe_saved_by_transformers_loads_with_its_logits(tmp_path):
    config = preset("nano").replace(num_nextn_predict_layers=0)
    torch.manual_seed(0)
    hf = glm4moe_like(config, "eager").eval()
    with torch.no_grad():
        for layer in hf.model.layers[config.first_k_dense_replace:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.05)
    hf.save_pretrained(tmp_path / "hf")

    model = MoEModel(config)
    model.load_state_dict(load_hf(tmp_path / "hf", config))  # strict: every tensor is there

    ids = tokens(config.vocab_size)
    assert relative_error(logits(model.eval(), ids), logits(hf, ids)) <= 1e-4


def test_load_hf_names_every_tensor_and_field_that_does_not_fit(tmp_path):
    saved = preset("nano").replace(num_nextn_predict_layers=0)
    glm4moe_like(saved, "eager").save_pretrained(tmp_path / "hf")

    wider = saved.replace(moe_intermediate_size=48)
    with pytest.raises(ExportError) as error:
        load_hf(tmp_path / "hf", wider)
    message = str(error.value)
    assert "model.layers.1.mlp.experts.7.down_proj.weight: expected shape [64, 48], found " \
           "[64, 32]" in message
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight: expected shape [48, 64], " \
           "found [32, 64]" in message

    with pytest.raises(ExportError, match="config.json routed_scaling_factor: expected 1.0, "
                                          "found 2.5"):
        load_hf(tmp_path / "hf", saved.replace(routed_scaling_factor=1.0))
