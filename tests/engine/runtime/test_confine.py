"""The engine reads a job's dataset, tokenizer and model.init_from only under the data roots the
platform gave it (`data.roots`): a path that was inside the roots when the platform validated
the spec and is swapped for a symlink to outside before the engine opens it is refused, with a
message that does not say whether anything exists out there; without roots (the engine's own
command line) every path is read as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.data.cache import prepared
from engine.errors import DataError, SpecError
from engine.export import ExportError, _write_tokenizer
from engine.runtime.confine import NO_MATCH, OUTSIDE, expand, open_confined, resolve
from engine.runtime.init_from import load_weights
from engine.runtime.spec import DatasetSpec, parse_spec
from tests.engine.runtime.test_init_from import save_checkpoint, spec_for, trained


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A data root holding a corpus, and a secret outside it."""
    root, outside = tmp_path / "root", tmp_path / "server"
    root.mkdir()
    outside.mkdir()
    (root / "corpus.txt").write_text("the user's own text " * 200)
    (outside / "secret_key").write_text("the server's secret " * 200)
    return root, outside


def swap_for_link(path: Path, target: Path) -> None:
    """What an attacker does between the platform's check and the engine's open."""
    path.unlink()
    path.symlink_to(target)


def test_a_dataset_file_swapped_for_a_link_outside_after_validation_is_refused(layout):
    root, outside = layout
    corpus = str(root / "corpus.txt")
    roots = [str(root)]
    assert resolve(corpus, roots, "train.dataset.paths.0") == corpus  # the platform's check
    swap_for_link(root / "corpus.txt", outside / "secret_key")

    with pytest.raises(DataError) as refused:
        prepared(DatasetSpec(kind="text", paths=[corpus]), roots)
    assert str(refused.value) == f"train.dataset.paths.0: {OUTSIDE}"


def test_a_glob_whose_match_became_a_link_outside_is_refused(layout):
    root, outside = layout
    swap_for_link(root / "corpus.txt", outside / "secret_key")
    with pytest.raises(DataError, match=OUTSIDE):
        prepared(DatasetSpec(kind="text", paths=[str(root / "*.txt")]), [str(root)])


def test_a_root_swapped_for_a_link_outside_is_refused(tmp_path, layout):
    root, outside = layout
    # the folder the spec names, inside the root at validation, is now a link to the server's
    (root / "mine").mkdir()
    (root / "mine" / "secret_key").write_text("harmless")
    resolve(str(root / "mine" / "secret_key"), [str(root)], "f")
    (root / "mine" / "secret_key").unlink()
    (root / "mine").rmdir()
    (root / "mine").symlink_to(outside)
    with pytest.raises(SpecError):
        open_confined(root / "mine" / "secret_key", [str(root)], "f")


def test_a_tokenizer_swapped_for_a_link_outside_is_refused_by_the_run_and_the_export(
        layout, tmp_path):
    root, outside = layout
    tokenizer = root / "tokenizer.json"
    tokenizer.write_text("{}")
    swap_for_link(tokenizer, outside / "secret_key")
    dataset = DatasetSpec(kind="text", paths=[str(root / "corpus.txt")],
                          tokenizer=str(tokenizer))
    with pytest.raises(DataError) as refused:
        prepared(dataset, [str(root)])
    assert str(refused.value) == f"train.dataset.tokenizer: {OUTSIDE}"

    spec = parse_spec({"name": "t", "data": {"roots": [str(root)]},
                       "train": {"dataset": {"kind": "text", "paths": dataset.paths,
                                             "tokenizer": str(tokenizer)}}})
    with pytest.raises(ExportError, match=OUTSIDE):
        _write_tokenizer(spec, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_init_from_swapped_for_a_link_to_another_checkpoint_is_refused(layout, tmp_path):
    root, _ = layout
    theirs = save_checkpoint(tmp_path / "their-job" / "checkpoints", trained(), spec_for())
    (root / "mine").symlink_to(theirs)
    spec = parse_spec({"name": "t", "data": {"roots": [str(root)]},
                       "model": {"preset": "nano", "init_from": str(root / "mine")}})
    with pytest.raises(SpecError) as refused:
        load_weights(spec, trained(seed=1), lambda event: None)
    assert refused.value.errors == {"model.init_from": OUTSIDE}


def test_outside_paths_answer_alike_whether_or_not_they_exist(layout):
    root, outside = layout
    roots = [str(root)]
    answers = set()
    for path in (outside / "secret_key", outside / "no-such-file", outside / "*",
                 root / ".." / "server" / "secret_key", "/etc/passwd", "/etc/no-such-file"):
        with pytest.raises(SpecError) as refused:
            expand(str(path), roots, "train.dataset.paths.0")
        answers.add(str(refused.value))
    assert answers == {f"train.dataset.paths.0: {OUTSIDE}"}


def test_a_glob_matching_nothing_inside_says_so_without_echoing_it(layout):
    root, _ = layout
    with pytest.raises(SpecError) as refused:
        expand(str(root / "missing-*.txt"), [str(root)], "train.dataset.paths.0")
    assert refused.value.errors == {"train.dataset.paths.0": NO_MATCH}


def test_without_roots_every_path_is_read_as_given(layout):
    _, outside = layout  # the engine's command line: one user's own tool
    assert (prepared(DatasetSpec(kind="text", paths=[str(outside / "secret_key")]))
            / "manifest.json").exists()
    with pytest.raises(DataError, match="no file matches"):
        prepared(DatasetSpec(kind="text", paths=[str(outside / "none*")]))
