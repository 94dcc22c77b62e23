"""model.init_from: a fresh run starts from an exported Hugging Face folder, any matching
Glm4Moe save_pretrained, or a Ringside checkpoint, with the source model's logits; what does
not fit is refused naming the tensor or the spec field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.moe_model import glm4moe_like
from engine.checkpoint import Checkpointer
from engine.errors import SpecError
from engine.export import ExportError, export
from engine.moe.model import MoEModel
from engine.runtime.init_from import load_optimizer, load_weights
from engine.runtime.spec import JobSpec, parse_spec
from tests.engine.runtime.test_control import Run, nano


def spec_for(init_from: Path | str = "", model: dict | None = None, **init) -> JobSpec:
    model = {"preset": "nano", **(model or {})}
    if init_from:
        model.update(init_from=str(init_from), **init)
    return parse_spec({"name": "init", "model": model})


def trained(seed: int = 0) -> MoEModel:
    torch.manual_seed(seed)
    model = MoEModel(spec_for().model)
    for layer in model.moe_layers:  # a trained bias, so that it changes the routing
        layer.router.expert_bias.normal_(0, 0.05)
    return model


def save_checkpoint(directory: Path, model: MoEModel, spec: JobSpec) -> Path:
    """A one-rank checkpoint as the trainer writes it: flat parameters and Adam moments, the
    train state's buffers and step count, the job spec in the manifest."""
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    params = {name for name, _ in model.named_parameters()}
    train = {"adam_step": 7,
             "buffers": {k: v for k, v in model.state_dict().items() if k not in params}}
    ckpt = Checkpointer(directory, memory_dir=None, meta={"spec": spec.to_dict()})
    moments = {kind: (torch.full_like(flat, i + 1.0), 0, flat.numel())
               for i, kind in enumerate(("exp_avg", "exp_avg_sq"))}
    ckpt.save(7, {"params": (flat, 0, flat.numel()), **moments}, {"train": train})
    ckpt.close()
    return directory


def logits(model: MoEModel) -> torch.Tensor:
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.eval()(ids, ids, return_logits=True).logits


def loaded(spec: JobSpec, seed: int = 1) -> tuple[MoEModel, list]:
    torch.manual_seed(seed)  # another initialisation than the source's
    model, events = MoEModel(spec.model), []
    load_weights(spec, model, events.append)
    return model, events


def test_a_ringside_checkpoint_gives_its_exact_logits(tmp_path):
    source = trained()
    save_checkpoint(tmp_path / "ckpt", source, spec_for())
    model, events = loaded(spec_for(tmp_path / "ckpt"))  # a folder of checkpoints: the newest
    assert torch.equal(logits(model), logits(source))
    assert events[0].message.startswith("initialised with the weights of checkpoint ")


def test_an_export_of_it_gives_the_same_logits(tmp_path):
    source = trained()
    save_checkpoint(tmp_path / "ckpt", source, spec_for())
    export(tmp_path / "ckpt", tmp_path / "hf", spec_for())
    model, events = loaded(spec_for(tmp_path / "hf"))
    assert torch.allclose(logits(model), logits(source), rtol=0, atol=1e-5)
    assert events[0].message == f"initialised with Hugging Face weights from {tmp_path / 'hf'}"


def test_a_random_glm4moe_saved_by_transformers_loads_with_its_logits(tmp_path):
    spec = spec_for()
    torch.manual_seed(0)
    hf = glm4moe_like(spec.model, "eager").eval()
    hf.save_pretrained(tmp_path / "hf")
    model, _ = loaded(spec_for(tmp_path / "hf"))
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(input_ids=ids).logits
    assert ((logits(model) - want).abs().max() / want.abs().max()).item() <= 1e-4


def test_a_checkpoint_of_another_shape_is_refused_naming_the_tensor(tmp_path):
    save_checkpoint(tmp_path / "ckpt", trained(), spec_for())
    wider = spec_for(tmp_path / "ckpt", model={"moe_intermediate_size": 48})
    with pytest.raises(ExportError, match=r"layers.1.ffn.experts.down: expected shape "
                                          r"\[8, 64, 48\], found \[8, 64, 32\]"):
        loaded(wider)


def test_a_hugging_face_folder_of_another_shape_is_refused_naming_the_tensor(tmp_path):
    glm4moe_like(spec_for().model, "eager").save_pretrained(tmp_path / "hf")
    with pytest.raises(ExportError, match=r"experts.7.down_proj.weight: expected shape "
                                          r"\[64, 48\], found \[64, 32\]"):
        loaded(spec_for(tmp_path / "hf", model={"moe_intermediate_size": 48}))


def test_a_missing_or_unusable_source_is_a_spec_error_naming_the_field(tmp_path):
    with pytest.raises(SpecError) as missing:
        loaded(spec_for(tmp_path / "nowhere"))
    assert missing.value.errors == {"model.init_from":
                                    f"no such file or directory: {tmp_path / 'nowhere'}"}
    with pytest.raises(SpecError, match="model.init_from: neither a Hugging Face folder"):
        loaded(spec_for(tmp_path))  # an empty folder
    glm4moe_like(spec_for().model, "eager").save_pretrained(tmp_path / "hf")
    with pytest.raises(SpecError, match="model.init_optimizer: a Hugging Face folder holds no"):
        loaded(spec_for(tmp_path / "hf", init_optimizer=True))


def test_the_spec_keeps_the_source_in_the_model_section():
    spec = spec_for("/ckpt", init_optimizer=True)
    assert spec.to_dict()["model"]["init_from"] == "/ckpt"
    assert parse_spec(spec.to_dict()) == spec
    assert "init_from" not in spec_for().to_dict()["model"]  # a fresh start adds nothing
    with pytest.raises(SpecError) as bad:
        parse_spec({"name": "x", "model": {"init_from": 3, "init_optimizer": True}})
    assert bad.value.errors == {"model.init_from": "must be a string",
                                "model.init_optimizer": bad.value.errors["model.init_optimizer"]}


class Shards:
    adam_step = 0

    def load_sharded_state(self, read) -> None:
        self.exp_avg = read("exp_avg", 0, 4)


def test_init_optimizer_takes_the_moments_and_step_count_too(tmp_path):
    save_checkpoint(tmp_path / "ckpt", trained(), spec_for())
    shards = Shards()
    load_optimizer(spec_for(tmp_path / "ckpt", init_optimizer=True), shards)
    assert shards.adam_step == 7 and torch.equal(shards.exp_avg, torch.ones(4))
    untouched = Shards()
    load_optimizer(spec_for(tmp_path / "ckpt"), untouched)
    assert untouched.adam_step == 0 and not hasattr(untouched, "exp_avg")


def test_a_run_on_two_ranks_starts_where_its_source_ended(tmp_path):
    source = Run(tmp_path, nano("source", steps=30, every=0))
    assert source.finish() == 0
    spec = nano("child", steps=2, every=0, strategy="GGG")  # another layout than the source's
    spec["model"]["init_from"] = str(source.run_dir / "checkpoints")
    child = Run(tmp_path, spec)
    assert child.finish() == 0

    before = [e["loss"] for e in source.events() if e["type"] == "step"]
    first = next(e["loss"] for e in child.events() if e["type"] == "step")
    # the same first batch as the source's step 1, on the source's trained weights
    assert first < before[0] - 0.5 and abs(first - before[-1]) < abs(first - before[0]) / 4
    assert any(e["type"] == "log" and e["message"].startswith("initialised with the weights")
               for e in child.events())
