"""ringside.vocabulary: the frontend names kinds, actions, tiers and states as engine.contract
does, from a module generated out of its enums."""

from __future__ import annotations

import re

from ringside.vocabulary import MODULE_PATH, vocabulary_module


def test_the_frontends_vocabulary_module_is_the_contracts():
    assert MODULE_PATH.read_text() == vocabulary_module(), (
        "frontend/static/js/vocabulary.js is stale: run `python manage.py vocabulary`")


def test_the_pages_import_the_names_they_compare_with():
    """The job page's checkpoints, exports and command results read the generated names."""
    scripts = MODULE_PATH.parent
    for name in ("job.js", "exports.js", "controls.js"):
        text = (scripts / name).read_text()
        assert 'from "./vocabulary.js"' in text, name
        assert not re.search(r'(tier \|\| "|action === ")', text), name


def test_the_pages_fill_a_left_out_spec_field_with_the_engines_default():
    """One default for `micro_batch` and its neighbours: the engine's spec, via the module."""
    scripts = MODULE_PATH.parent
    for name in ("shares.js", "controls.js"):
        text = (scripts / name).read_text()
        assert "SpecDefaults" in text, name
        assert not re.search(r"(micro_batch|grad_accum|seq_len|nodes|procs_per_node) \?\? \d",
                             text), name
