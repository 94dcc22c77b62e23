"""A checkpoint's lineage: the code, spec and data that made it and the checkpoints it came
from, recorded at every save and carried into an export's README and config.json."""

from __future__ import annotations

import json
import subprocess

from engine.checkpoint.reader import resolve
from engine.export import LINEAGE_KEY, export
from engine.runtime.events import read_events
from engine.runtime.launch import RunTarget, launch
from engine.runtime.lineage import Lineage, Parent, code_version, spec_sha256
from engine.runtime.spec import parse_spec
from tests.engine.runtime.test_init_from import save_checkpoint, spec_for, trained
from tests.engine.runtime.test_train import REPO


def test_the_code_version_is_the_checkouts_commit():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert code_version() == f"git:{head}"


def test_the_spec_hash_ignores_the_name_but_not_what_is_trained():
    base = {"model": {"preset": "nano"}, "train": {"steps": 10}}
    first = spec_sha256(parse_spec({"name": "a", **base}))
    assert spec_sha256(parse_spec({"name": "a-clone", **base})) == first
    assert spec_sha256(parse_spec({"name": "a", **base, "train": {"steps": 11}})) != first


def test_a_parent_brings_its_own_parents_newest_first():
    spec = parse_spec({"name": "a", "model": {"preset": "nano"}})
    lineage = Lineage(spec, [])
    lineage.descend(Parent("init_from", "/a/step-000007", 7, None))
    older = lineage.record(10, [])
    lineage.descend(Parent("rollback", "/b/step-000010", 10, older))
    assert [(p["kind"], p["step"]) for p in lineage.record(12, [])["parents"]] == [
        ("rollback", 10), ("init_from", 7)]


def test_an_export_after_an_init_from_and_a_rollback_names_both_parents(tmp_path):
    source = save_checkpoint(tmp_path / "source", trained(), spec_for())
    spec = parse_spec({
        "name": "lineage", "model": {"preset": "nano", "init_from": str(source)},
        "parallel": {"nodes": 1, "procs_per_node": 1},
        "train": {"steps": 16, "micro_batch": 2, "seq_len": 64, "eval_every": 0, "warmup": 5,
                  "threads": 1},
        "checkpoint": {"every": 5},
        "faults": {"inject": [{"kind": "loss_spike", "step": 14, "rank": 0, "factor": 10.0}],
                   "policy": {"actions": {"loss_spike": ["rollback"]}}},
    })
    target = RunTarget(run_dir=tmp_path / "run", events_path=tmp_path / "events.jsonl",
                       job=spec.name)
    assert launch(spec, target) == 0
    saves = {e["step"]: e for e in read_events(target.events_path) if e["type"] == "checkpoint"}

    before = saves[10]["lineage"]  # saved after the init_from, before the rollback
    assert before["parents"] == [{"kind": "init_from", "path": str(source / "step-000007"),
                                  "step": 7}]
    assert before["spec_sha256"] == spec_sha256(spec)
    (data,) = before["sources"]
    assert data["tokens"] == 10 * 2 * 64 and len(data["manifest_sha256"]) == 64
    assert len(data["tokenizer_sha256"]) == 64

    final = resolve(target.run_dir / "checkpoints")
    assert final.step == 16 and final.meta["lineage"] == saves[16]["lineage"]
    out = tmp_path / "hf"
    export(final.path, out, spec)
    lineage = json.loads((out / "config.json").read_text())[LINEAGE_KEY]
    assert [(p["kind"], p["step"]) for p in lineage["parents"]] == [("rollback", 10),
                                                                      ("init_from", 7)]
    assert lineage["parents"][0]["path"] == saves[10]["path"]
    assert lineage["checkpoint"] == str(final.path)
    readme = (out / "README.md").read_text()
    assert "## Lineage" in readme and f"rollback from `{saves[10]['path']}` (step 10)" in readme
    assert f"init_from from `{source / 'step-000007'}` (step 7)" in readme
