"""The job spec: presets plus overrides, and an error naming every bad field."""

import re
from pathlib import Path

import pytest

from engine.runtime.spec import SPEC_BOUNDS, SpecError, layout_on_hosts, parse_spec, with_layout


def errors_of(data) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return info.value.errors


def test_a_minimal_spec_takes_the_defaults():
    spec = parse_spec({"name": "demo"})
    assert spec.parallel.world_size == 1
    assert spec.parallel.strategy == "NNN"
    assert spec.train.dataset.kind == "stdlib"


def test_model_fields_override_the_preset():
    spec = parse_spec({"name": "demo", "model": {"preset": "nano", "num_experts": 4}})
    assert spec.preset == "nano"
    assert spec.model.num_experts == 4
    assert spec.model.hidden_size == 64  # from the nano preset


def test_round_trip_through_json_form():
    spec = parse_spec({
        "name": "demo", "model": {"preset": "tiny"}, "parallel": {"nodes": 2, "procs_per_node": 2},
        "faults": {"inject": [{"kind": "nan", "step": 3, "rank": 1}]},
    })
    assert parse_spec(spec.to_dict()) == spec


def test_every_bad_field_is_named():
    errors = errors_of({
        "name": "demo",
        "bogus": 1,
        "model": {"preset": "tiny", "hidden_sise": 3},
        "train": {"steps": "ten", "dataset": {"kind": "csv"}},
        "parallel": {"collective": "mpi"},
    })
    assert errors == {
        "bogus": "unknown field",
        "model.hidden_sise": "unknown field",
        "train.steps": "must be an integer",
        "train.dataset.kind": "must be one of: stdlib, text, jsonl, parquet",
        "parallel.collective": "must be one of: native, ring, hier, horing",
    }


def test_semantic_errors_name_their_fields():
    errors = errors_of({
        "name": "bad name!",
        "model": {"preset": "nano", "num_experts": 7},
        "parallel": {"strategy": "XYZ", "nodes": 0},
        "train": {"lr": -1.0, "dataset": {"kind": "text"}},
        "faults": {"inject": [{"kind": "crash", "step": 999, "rank": 5},
                              {"kind": "slow_rank", "step": 5, "rank": 0, "until": 4}]},
    })
    assert set(errors) == {
        "name", "model.n_group", "parallel.strategy", "parallel.nodes", "train.lr",
        "train.dataset.paths", "faults.inject.0.step", "faults.inject.0.rank",
        "faults.inject.1.rank", "faults.inject.1.until",
    }
    assert "NNN" in errors["parallel.strategy"]


def test_missing_name_and_unknown_preset():
    errors = errors_of({"model": {"preset": "huge"}})
    assert errors["name"] == "this field is required"
    assert errors["model.preset"].startswith("unknown preset")


def test_types_are_strict():
    errors = errors_of({"name": "x", "train": {"micro_batch": 2.5, "lr": "fast"},
                        "model": {"use_qk_norm": 1}})
    assert errors == {
        "train.micro_batch": "must be an integer",
        "train.lr": "must be a number",
        "model.use_qk_norm": "must be true or false",
    }


def test_a_nul_character_is_refused_where_it_appears():
    """PostgreSQL cannot store one in the job's spec."""
    errors = errors_of({"name": "bad\x00name", "train": {"dataset": {"paths": ["a\x00b"]}},
                        "faults": {"policy": {"actions": {"nan\x00": ["observe"]}}}})
    assert errors["name"] == "must not contain a NUL character"
    assert errors["train.dataset.paths.0"] == "must not contain a NUL character"
    assert errors["faults.policy.actions"] == "a key contains a NUL character"


def test_the_fault_policy_is_checked_field_by_field():
    errors = errors_of({"name": "x", "faults": {"policy": {
        "thresholds": {"loss_spike": {"z": -1.0}, "weather": {}},
        "actions": {"nan": ["reboot"]},
    }}})
    assert set(errors) >= {"faults.policy.actions.nan.0"}
    assert any(k.startswith("faults.policy.thresholds") for k in errors)


def test_a_layout_change_keeps_the_global_batch_and_drops_faults_on_ranks_that_go_away():
    data = {"name": "t", "model": {"preset": "nano"}, "parallel": {"nodes": 2, "procs_per_node": 2},
            "train": {"steps": 10, "micro_batch": 2},
            "faults": {"inject": [{"kind": "slow_rank", "step": 2, "rank": 3},
                                  {"kind": "nan", "step": 4, "rank": 0}]}}
    spec = parse_spec(with_layout(data, {"nodes": 1, "procs_per_node": 2}, micro_batch=4))
    assert (spec.parallel.world_size, spec.train.micro_batch) == (2, 4)
    assert [(i.kind, i.rank) for i in spec.faults.inject] == [("nan", 0)]
    assert data["faults"]["inject"][0]["rank"] == 3  # the caller's spec is left as it was


def test_the_readme_spec_table_lists_every_bound_as_defined():
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    documented = {}
    for row in re.findall(r"^\| `(\w+)` \|.*\| (.*) \|$", readme, flags=re.M):
        section, bounds = row
        for field, most in re.findall(r"`([\w.*]+)` (\d+)", bounds):
            documented[f"{section}.{field}"] = int(most)
    assert documented == SPEC_BOUNDS


@pytest.mark.parametrize("path, most", sorted(SPEC_BOUNDS.items()))
def test_a_value_past_its_bound_is_refused_naming_the_field(path, most):
    field = path.replace("*", "0").replace("thresholds.0.0", "thresholds.loss_spike.z")
    data = {"name": "demo", "faults": {"inject": [{"kind": "loss_spike", "step": 1}]}}
    *parents, last = field.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = most + 1
    assert errors_of(data)[field] == f"must be at most {most}"


def test_hosts_default_to_one_and_the_fewest_hosts_to_all_of_them():
    assert (parse_spec({"name": "x"}).parallel.hosts, parse_spec({"name": "x"}).parallel.min_hosts,
            parse_spec({"name": "x"}).parallel.scale_up) == (1, 1, True)
    p = parse_spec({"name": "x", "parallel": {"nodes": 4, "hosts": 2}}).parallel
    assert (p.hosts, p.min_hosts) == (2, 2)
    p = parse_spec({"name": "x", "parallel": {"nodes": 4, "hosts": 2, "min_hosts": 1,
                                              "scale_up": False}}).parallel
    assert (p.hosts, p.min_hosts, p.scale_up) == (2, 1, False)
    assert parse_spec(parse_spec({"name": "x", "parallel": {"nodes": 2, "hosts": 2}}).to_dict()
                      ).parallel.min_hosts == 2


def test_each_host_runs_its_share_of_the_nodes_ranks():
    """The one place the layout over hosts is worked out (placement's slots, the launcher's
    ranks per host, the platform's memory fit and which host runs a rank)."""
    p = parse_spec({"name": "x", "parallel": {"nodes": 4, "procs_per_node": 3, "hosts": 2}})
    assert p.parallel.ranks_per_host == 6
    assert parse_spec({"name": "x"}).parallel.ranks_per_host == 1


@pytest.mark.parametrize("parallel, field, message", [
    ({"nodes": 3, "hosts": 2}, "parallel.hosts", "must divide parallel.nodes (3)"),
    ({"hosts": 0}, "parallel.hosts", "must be at least 1"),
    ({"hosts": 2000}, "parallel.hosts", "must be at most 1024"),
    ({"hosts": 1.5}, "parallel.hosts", "must be an integer"),
    ({"nodes": 2, "hosts": 2, "min_hosts": 3}, "parallel.min_hosts", "must be between 1 and"),
    ({"nodes": 2, "hosts": 2, "min_hosts": 0}, "parallel.min_hosts", "must be between 1 and"),
    ({"min_hosts": "one"}, "parallel.min_hosts", "must be an integer"),
    ({"scale_up": "yes"}, "parallel.scale_up", "must be true or false"),
])
def test_bad_hosts_are_named(parallel, field, message):
    errors = errors_of({"name": "x", "parallel": parallel})
    assert list(errors) == [field] and message in errors[field]


def two_hosts(micro_batch: int, grad_accum: int, **parallel) -> dict:
    return {"name": "x", "parallel": {"nodes": 4, "procs_per_node": 2, "hosts": 2, **parallel},
            "train": {"micro_batch": micro_batch, "grad_accum": grad_accum},
            "faults": {"inject": [{"kind": "nan", "step": 3, "rank": 5}]}}


def global_batch(data: dict) -> int:
    spec = parse_spec(data)
    return spec.train.micro_batch * spec.train.grad_accum * spec.parallel.world_size


def test_on_fewer_hosts_the_global_batch_is_kept_by_more_accumulation():
    laid = layout_on_hosts(two_hosts(micro_batch=4, grad_accum=1, min_hosts=1), 1)
    spec = parse_spec(laid)
    assert (spec.parallel.nodes, spec.parallel.procs_per_node) == (2, 2)
    assert (spec.parallel.hosts, spec.parallel.min_hosts) == (1, 1)
    assert (spec.train.micro_batch, spec.train.grad_accum) == (4, 2)
    assert global_batch(laid) == global_batch(two_hosts(4, 1))
    assert laid["faults"]["inject"] == []  # rank 5 is not part of the smaller job
    # laid out again, it is the job it came from
    back = parse_spec(layout_on_hosts(laid, 2))
    assert (back.parallel.nodes, back.train.micro_batch, back.train.grad_accum) == (4, 4, 1)


def test_on_more_hosts_the_micro_batch_shrinks_when_accumulation_cannot():
    spec = parse_spec(layout_on_hosts(two_hosts(micro_batch=4, grad_accum=1), 4))
    assert (spec.parallel.nodes, spec.parallel.hosts, spec.parallel.min_hosts) == (8, 4, 2)
    assert (spec.train.micro_batch, spec.train.grad_accum) == (2, 1)
    # 6 sequences a rank on 2 of 3 hosts: micro-batches of 3 (the largest under 4), twice
    three = {"name": "x", "parallel": {"nodes": 3, "hosts": 3}, "train": {"micro_batch": 4}}
    spec = parse_spec(layout_on_hosts(three, 2))
    assert (spec.parallel.nodes, spec.train.micro_batch, spec.train.grad_accum) == (2, 3, 2)


@pytest.mark.parametrize("data, hosts, field, message", [
    (two_hosts(micro_batch=1, grad_accum=1), 3, "parallel.hosts",
     "the global batch (8 sequences) does not divide over the 12 ranks of 3 hosts"),
    (two_hosts(micro_batch=1, grad_accum=1), 0, "parallel.hosts", "must be a positive integer"),
    (two_hosts(micro_batch=1, grad_accum=1024), 1, "train.grad_accum", "must be at most 1024"),
])
def test_a_layout_that_cannot_keep_the_global_batch_is_refused_naming_the_field(
        data, hosts, field, message):
    with pytest.raises(SpecError) as info:
        layout_on_hosts(data, hosts)
    assert message in info.value.errors[field]
