"""engine.contract: every event and command crosses the engine/platform seam in one typed form,
and anything malformed is refused with the field named."""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import contract
from engine.contract import (
    COMMAND_RULES,
    EVENT_CLASSES,
    EVENT_TYPES,
    ActionEvent,
    ActionName,
    AnomalyEvent,
    AnomalyKind,
    BadBatchEvent,
    CheckpointEvent,
    CheckpointTier,
    Command,
    CommandKind,
    ContractError,
    EvaluationEvent,
    ExpertsEvent,
    Header,
    JobState,
    LogEvent,
    MembershipEvent,
    OpsEvent,
    ProposalEvent,
    StateEvent,
    StepEvent,
    checkpoint_dir,
    checkpoint_tiers,
    memory_dir,
    parse_event,
)

# event types added after DESIGN.md was written; the README lists them
BEYOND_DESIGN = ("membership", "proposal", "bad_batch", "evaluation")
DESIGN = Path(__file__).resolve().parents[3] / "shared" / "DESIGN.md"

# one event of every type, as the engine emits it
SAMPLES = [
    StateEvent(step=0, state="running", world_size=4, device="cpu", dtype="float32",
               strategy="IIG", params=1234),
    StepEvent(step=7, loss=2.5, grad_norm=0.8, lr=1e-3, tokens_per_s=1e4, step_time=0.2,
              tokens=8192, memory={"rss_bytes": 1 << 30}, eval_loss=2.6,
              state_bytes={"params": 10}, comm={"intra_bytes": 5},
              system={"cpu_percent": [50.0, 48.0]}),
    OpsEvent(step=7, step_ms=200.0, void_share=0.01, data_wait_share=0.02,
             ops={"forward": {"kind": "compute", "total_ms": 80.0}}, ranks=[{"rank": 0}]),
    ExpertsEvent(step=7, layers=[{"tokens_per_expert": [3, 5], "dead_experts": 0}]),
    AnomalyEvent(step=9, kind="loss_spike", severity="warning", rank=None,
                 evidence={"z": 7.1}),
    ActionEvent(step=9, action="rollback", by="command", command="12",
                details={"from_step": 9, "to_step": 5, "skip_data": True}),
    CheckpointEvent(step=10, path="/runs/1/checkpoints/step-000010", tier="disk",
                    blocking_s=0.01, size_bytes=4096, strategy="NNN", world_size=2,
                    lineage={"spec_sha256": "9f2c", "parents": [
                        {"kind": "rollback", "path": "/runs/1/checkpoints/step-000005",
                         "step": 5}]}),
    LogEvent(step=10, level="info", message="resumed", details={"trace": "t.json"}),
    MembershipEvent(step=40, hosts_before=["a", "b"], hosts_after=["a"], world_size=2,
                    reason="host b lost"),
    BadBatchEvent(step=30, anomaly="loss_spike", ranks=[1], samples=[118, 119],
                  windows=[5120, 77], evidence={"loss": [3.1, 8.6], "rerun_loss": [3.1, 8.6]}),
    ProposalEvent(step=9, id="p-9-1", status="pending", action="rollback", anomaly="loss_spike",
                  deadline=1.7e9, default="proposed", hold=True, evidence={"z": 7.1}),
    EvaluationEvent(step=10, evaluation=3, checkpoint="/runs/1/checkpoints/step-000010",
                    heldout={"web": {"loss": 2.1, "perplexity": 8.17, "windows": 32}},
                    tasks={"letters": {"kind": "choice", "items": 4, "accuracy": 0.75}}),
]


def test_there_is_a_sample_of_every_event_type():
    assert sorted(type(e).type for e in SAMPLES) == sorted(EVENT_TYPES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type)
def test_every_event_type_round_trips_through_json(event):
    event.job, event.seq, event.time = "42", 3, 1700000000.5
    wire = json.loads(json.dumps(event.to_dict()))
    assert wire["type"] == event.type
    assert parse_event(wire) == event


def test_fields_outside_the_declaration_travel_flat_and_come_back_as_details():
    wire = SAMPLES[5].to_dict()
    assert wire["from_step"] == 9 and "details" not in wire
    assert parse_event(wire).details == {"from_step": 9, "to_step": 5, "skip_data": True}


def test_unset_optional_fields_are_left_off_the_wire():
    wire = StateEvent(step=0, state="starting", world_size=2).to_dict()
    assert set(wire) == {"type", "step", "job", "time", "seq", "state", "world_size"}


def test_a_nan_loss_travels_as_a_string_and_parses_back_to_nan():
    wire = StepEvent(step=1, loss=math.nan, grad_norm=math.inf, lr=0.0, tokens_per_s=0.0,
                     step_time=1.0, tokens=0, memory={}).to_dict()
    assert (wire["loss"], wire["grad_norm"]) == ("nan", "inf")
    json.dumps(wire, allow_nan=False)
    parsed = parse_event(wire)
    assert math.isnan(parsed.loss) and parsed.grad_norm == math.inf


@pytest.mark.parametrize(("wire", "field"), [
    ({"type": "anomaly", "step": 3, "severity": "error"}, "anomaly.kind"),
    ({"type": "step", "step": "seven", "loss": 1.0}, "step.step"),
    ({"type": "checkpoint", "step": 1, "path": 5, "tier": "disk", "blocking_s": 0.1,
      "size_bytes": 1, "strategy": "NNN", "world_size": 1}, "checkpoint.path"),
    ({"type": "action", "step": 1, "action": "rollback", "rung": "two"}, "action.rung"),
    ({"type": "state", "step": 1, "state": "running", "world_size": True}, "state.world_size"),
    ({"type": "teleport", "step": 1}, "type"),
    ({"step": 1}, "type"),
    (["not", "an", "object"], "event"),
])
def test_a_malformed_event_is_refused_naming_the_field(wire, field):
    with pytest.raises(ContractError) as refused:
        parse_event(wire)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")


def test_a_refused_command_is_an_action_event_that_says_so():
    refused = parse_event({"type": "action", "step": 4, "action": "refused", "command": "3",
                           "kind": "rollback", "error": "rollback: no good checkpoint"})
    assert refused.refused and refused.error.startswith("rollback:")
    assert not parse_event(SAMPLES[5].to_dict()).refused


def test_commands_round_trip_and_name_a_bad_field():
    command = Command(kind=CommandKind.ROLLBACK, args={"step": 40, "skip_data": True}, id="7")
    assert Command.from_dict(json.loads(json.dumps(command.to_dict()))) == command
    assert Command.from_dict({"kind": "pause"}) == Command(kind=CommandKind.PAUSE)
    for bad, field in [("pause", "command"), ({"kind": "explode"}, "command.kind"),
                       ({"kind": "pause", "args": [1]}, "command.args")]:
        with pytest.raises(ContractError) as refused:
            Command.from_dict(bad)
        assert refused.value.field == field


def test_every_command_kind_has_a_rule_and_moves_only_to_known_states():
    assert set(COMMAND_RULES) == set(CommandKind)
    for rule in COMMAND_RULES.values():
        assert rule.allowed_in and rule.allowed_in <= set(JobState)
        assert rule.moves_to is None or rule.moves_to in JobState
    assert COMMAND_RULES[CommandKind.RESUME].allowed_in == {JobState.PAUSED, JobState.PAUSED_WARM}
    assert JobState.COMPLETED not in COMMAND_RULES[CommandKind.CANCEL].allowed_in


def test_an_entry_id_carries_the_event_seq_and_the_platforms_entries_after_it():
    assert contract.entry_id(41) == "41-0"
    assert contract.entry_seq(b"41-0") == (41, 0)
    assert contract.entry_seq(contract.entry_id(41, 2)) == (41, 2)


def test_checkpoint_folder_and_tiers(tmp_path):
    assert checkpoint_dir("", tmp_path) == tmp_path / "checkpoints"
    assert checkpoint_dir("/shared/ckpt", tmp_path) == Path("/shared/ckpt")
    folder = tmp_path / "checkpoints"
    assert checkpoint_tiers(folder) == [memory_dir(folder), folder]
    assert memory_dir(folder) == memory_dir(str(folder) + "/")  # one folder, one tier
    # hosts emulated on one machine share /dev/shm: each named host has a tier of its own
    assert len({memory_dir(folder), memory_dir(folder, "h0"), memory_dir(folder, "h1")}) == 3


def test_the_contract_imports_nothing_but_the_standard_library():
    script = ("import sys; import engine.contract, engine.ports; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('torch', 'numpy', 'django', 'redis', 'psutil', 'fsspec')))")
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, cwd=Path(contract.__file__).parents[1])
    assert found.stdout.strip() == "[]"


@pytest.mark.skipif(not DESIGN.exists(), reason=f"no DESIGN.md at {DESIGN} (the shared "
                    "folder sits beside the checkout in development and CI)")
def test_designs_event_list_is_the_contracts():
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("### Events", 1)[1].split("###", 1)[0]
    listed = re.findall(r"`(\w+)`(?: \(|\.)", section)
    assert sorted(listed + list(BEYOND_DESIGN)) == sorted(EVENT_CLASSES)


def test_events_beyond_designs_list_are_in_the_readme():
    readme = (Path(contract.__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Events", 1)[1].split("\n## ", 1)[0]
    for name in BEYOND_DESIGN:
        assert f"`{name}`" in section.split("beyond DESIGN.md", 1)[1]


# -- the vocabulary ------------------------------------------------------------------------

SOURCE_ROOTS = [Path(contract.__file__).parents[1] / name for name in ("engine", "platform")]
# the calls that emit a name of the vocabulary, and where in the call the name is
EMITTERS = {"Anomaly": ("kind", AnomalyKind), "AnomalyEvent": ("kind", AnomalyKind),
            "ActionEvent": ("action", ActionName), "CheckpointEvent": ("tier", CheckpointTier)}


def emitted_names() -> list[tuple[str, type, ast.expr]]:
    """(where, enum, the name's expression) of every emit call in engine/ and platform/."""
    found = []
    for root in SOURCE_ROOTS:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in EMITTERS):
                    continue
                keyword, enum = EMITTERS[node.func.id]
                given = [k.value for k in node.keywords if k.arg == keyword]
                if node.func.id == "Anomaly" and node.args:
                    given.append(node.args[0])
                found += [(f"{path.name}:{node.lineno}", enum, value) for value in given]
    return found


def test_every_name_the_engine_and_platform_emit_is_a_member_of_its_enum():
    """A kind, action or tier is named by its enum member, never spelled out: one the
    platform, the goodput fold or the frontend did not know could not be emitted."""
    emitted = emitted_names()
    spelled = [where for where, _, value in emitted if isinstance(value, ast.Constant)]
    assert spelled == []
    named = {(enum, value.attr) for _, enum, value in emitted
             if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
             and value.value.id == enum.__name__}
    assert all(member in enum.__members__ for enum, member in named)
    # the kinds emitted outside the detectors' loops, the platform's and the loader's included
    assert {m for enum, m in named if enum is AnomalyKind} >= {
        "NAN", "THROUGHPUT_DROP", "MEMORY_GROWTH", "STRAGGLER", "EXPERT_COLLAPSE", "HANG",
        "CRASH", "SDC_SUSPECT", "HOST_LOST", "CHECKPOINT_CORRUPT"}


def test_every_member_of_the_vocabulary_is_used_outside_the_contract():
    """No name nothing emits (as `page` was in the platform's passive actions)."""
    text = "\n".join(path.read_text() for root in SOURCE_ROOTS for path in root.rglob("*.py")
                     if path.name != "contract.py")
    for enum in (AnomalyKind, CheckpointTier):
        unused = [m for m in enum.__members__ if f"{enum.__name__}.{m}" not in text]
        assert unused == [], enum.__name__


def test_the_fault_ladders_and_commands_speak_the_vocabulary():
    from engine.anomaly.anomaly import KINDS, REPORTED_ONLY
    from engine.anomaly.policy import ACTIONS, DEFAULT_LADDERS, DEFAULTS

    assert set(KINDS) | REPORTED_ONLY == set(AnomalyKind)
    assert list(DEFAULT_LADDERS) == list(DEFAULTS) == list(KINDS)
    assert {rung for ladder in DEFAULT_LADDERS.values() for rung in ladder} <= set(ACTIONS)
    assert set(ACTIONS) <= set(ActionName)
    # a command carried out is named by its kind in the `action` event
    assert set(CommandKind) <= set(ActionName)


def test_the_wire_header_leads_every_emitted_event(tmp_path):
    from engine.runtime.events import EventLog

    log = EventLog("7", tmp_path / "events.jsonl")
    wire = log.emit(ActionEvent(step=3, action=ActionName.REFUSED, error="no"))
    assert list(wire)[:len(Header)] == list(Header)
    line = (tmp_path / "events.jsonl").read_text()
    assert list(json.loads(line))[:5] == ["type", "job", "step", "time", "seq"]
    assert json.loads(line)["action"] == "refused"
    assert parse_event(json.loads(line)).refused
