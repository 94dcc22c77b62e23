"""A fresh run's first weights from elsewhere (`model.init_from`): a Hugging Face folder in the
Glm4Moe layout (what `engine.export` writes, or any `Glm4MoeForCausalLM.save_pretrained` of a
matching config) or a Ringside checkpoint (a step folder, or a folder of them: its newest good
one), saved under any layout and world size.

`load_weights` fills the plain model before the data-parallel wrapper is built, on every rank
alike (the wrapper then starts every rank from rank 0's parameters, which are these). With
`model.init_optimizer` a Ringside checkpoint's Adam moments and step count come too:
`load_optimizer`, once the wrapper's shards exist, reads this rank's part of them with the
reshard-on-load reader. A resumed run calls neither: its own checkpoint wins.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from engine.checkpoint import CheckpointError, CheckpointReader
from engine.checkpoint.reader import resolve
from engine.contract import Event, LogEvent
from engine.errors import SpecError
from engine.export import (
    ExportError,
    checkpoint_buffers,
    exported_lineage,
    load_hf,
    model_layout,
)
from engine.moe.config import MoEConfig
from engine.runtime.confine import resolve as resolve_confined
from engine.runtime.lineage import Parent
from engine.runtime.spec import JobSpec, parse_spec


def load_weights(spec: JobSpec, model: nn.Module, emit: Callable[[Event], None]
                 ) -> Parent | None:
    """Load `model.init_from` into `model` (fp32 values into its dtype) and log it; the
    lineage's parent it names, None without a source. SpecError naming the field for a missing
    or unusable source, ExportError naming each tensor that does not fit."""
    if not spec.init.init_from:
        return None
    loaded, parent = _load(_source(spec), spec, model)
    emit(LogEvent(step=0, level="info", message=f"initialised with {loaded}"))
    return parent


def _load(path: Path, spec: JobSpec, model: nn.Module) -> tuple[str, Parent]:
    if not path.exists():
        raise SpecError({"model.init_from": f"no such file or directory: {path}"})
    if (path / "config.json").exists():
        if spec.init.init_optimizer:
            raise SpecError({"model.init_optimizer": "a Hugging Face folder holds no "
                                                     "optimizer state"})
        state = load_hf(path, spec.model)
        model.load_state_dict(state, strict=False)  # no MTP layers in Glm4Moe: ours stay fresh
        lineage = exported_lineage(path)  # a Ringside export's, None for others
        return f"Hugging Face weights from {path}", Parent(
            "init_from", str(path), lineage and lineage.get("step"), lineage)
    with _open(path) as reader:
        load_checkpoint_weights(reader, spec.model, model)
        info = reader.info
        return f"the weights of checkpoint {info.path}", Parent(
            "init_from", str(info.path), info.step, info.meta.get("lineage"))


def load_checkpoint_weights(reader: CheckpointReader, config: MoEConfig, model: nn.Module) -> None:
    """Fill `model` (an `MoEModel(config)`) with the checkpoint's parameters and buffers, from
    any saved layout; ExportError naming each tensor of another model."""
    _check_layout(reader, config)
    flat = reader.read("params", 0, reader.tensors["params"]["length"])
    with torch.no_grad():
        offset = 0
        for p in model.parameters():  # the flat buffer's order
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    model.load_state_dict(checkpoint_buffers(reader), strict=False)


class HasShards(Protocol):
    adam_step: int

    def load_sharded_state(self, read: Callable[[str, int, int], torch.Tensor]) -> None: ...


def load_optimizer(spec: JobSpec, dp: HasShards) -> None:
    """The Adam moments and step count of a Ringside `model.init_from`, when
    `model.init_optimizer` asks for them (the parameters come again, the same values)."""
    if not spec.init.init_optimizer:
        return
    with _open(_source(spec)) as reader:
        dp.load_sharded_state(reader.read)
        extras = reader.extras(0)
        dp.adam_step = int(extras.get("train", extras)["adam_step"])  # older: flat extras


def _source(spec: JobSpec) -> Path:
    """`model.init_from` at its real path, refused (SpecError) outside the job's data roots."""
    return Path(resolve_confined(spec.init.init_from, spec.data.roots, "model.init_from"))


def _open(path: Path) -> CheckpointReader:
    try:
        return CheckpointReader(resolve(path))
    except (CheckpointError, OSError) as e:
        raise SpecError({"model.init_from": f"neither a Hugging Face folder (no config.json) "
                                            f"nor a usable Ringside checkpoint: {e}"}) from e


def _check_layout(reader: CheckpointReader, config: MoEConfig) -> None:
    """Refuse a checkpoint of another model, naming each tensor whose shape differs (from the
    job spec its manifest carries), else by the parameter count."""
    ours, _ = model_layout(config)
    saved_spec = reader.info.meta.get("spec")
    if saved_spec is not None:
        theirs, _ = model_layout(parse_spec(saved_spec).model)
        errors = [f"{name}: expected shape {list(shape)}, found "
                  f"{list(theirs[name][1]) if name in theirs else 'none'}"
                  for name, (_, shape) in ours.items()
                  if theirs.get(name, (0, None))[1] != shape]
        errors += [f"{name}: not in this model" for name in theirs.keys() - ours.keys()]
    else:
        saved = reader.tensors["params"]["length"]
        wanted = sum(torch.Size(shape).numel() for _, shape in ours.values())
        errors = [] if saved == wanted else [f"params: {saved} saved, the model has {wanted}"]
    if errors:
        raise ExportError(f"{reader.info.path} does not fit the MoEConfig:\n  "
                          + "\n  ".join(errors))
