"""Raw sources: a text file is one document, a JSONL line one (its field), a Parquet row one
(its column); a large JSONL file read in pieces gives the same documents; the built-in corpus
is the standard library's sources."""

from __future__ import annotations

import json

import pytest

from engine.data.sources import (
    SourceSpec,
    iter_documents,
    pieces,
    read_piece,
    source_files,
    stdlib_source,
    stdlib_source_files,
)
from engine.errors import DataError


def write_jsonl(path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "other": 1}) + "\n" for t in texts))
    return path


def test_the_built_in_corpus_is_the_standard_library_source():
    files = stdlib_source_files()
    assert any(f.name == "os.py" for f in files)
    assert not any("test" in f.parts or "site-packages" in f.parts for f in files)
    assert stdlib_source().paths == [str(f) for f in files]


def test_text_files_are_documents_in_glob_order(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "empty.txt").write_text("")
    files = source_files([SourceSpec("text", [str(tmp_path / "*.txt")])])
    assert [f.size for f in files] == [5, 6, 0]
    assert list(iter_documents(files)) == ["first", "second"]


def test_jsonl_read_in_pieces_gives_every_record_once(tmp_path):
    texts = [f"record {i} " + "x" * (i % 37) for i in range(60)]
    path = write_jsonl(tmp_path / "c.jsonl", texts, field="body")
    files = source_files([SourceSpec("jsonl", [str(path)], field="body")])
    for size in (3, 64, 1000, 10**9):  # pieces that cut lines anywhere, and one piece
        split = pieces(files, piece_bytes=size)
        assert [d for p in split for d in read_piece(p)[0]] == texts, size


def test_parquet_rows_are_documents_of_their_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["one", "", "three"], "n": [1, 2, 3]}),
                   tmp_path / "d.parquet")
    spec = SourceSpec("parquet", [str(tmp_path / "d.parquet")], field="content")
    assert list(iter_documents(source_files([spec]))) == ["one", "three"]
    with pytest.raises(DataError, match=r"train\.dataset\.field: .* column 'n' is int64"):
        list(iter_documents(source_files([SourceSpec("parquet", spec.paths, field="n")])))
    with pytest.raises(DataError, match=r"train\.dataset\.field: .* no column 'text'"):
        list(iter_documents(source_files([SourceSpec("parquet", spec.paths)])))


def test_bad_user_data_names_the_field(tmp_path):
    with pytest.raises(DataError, match=r"train\.dataset\.paths\.0: no file matches"):
        source_files([SourceSpec("text", [str(tmp_path / "none*.txt")])], (),
                     "train.dataset.paths")
    (tmp_path / "d.jsonl").write_text('{"text": "fine"}\n{"text": 1}\n')
    with pytest.raises(DataError, match=r"train\.dataset\.field: .* at byte 17 has no string"):
        list(iter_documents(source_files([SourceSpec("jsonl", [str(tmp_path / "d.jsonl")])])))
    (tmp_path / "e.jsonl").write_text("not json\n")
    with pytest.raises(DataError, match=r"train\.dataset\.paths: .* at byte 0 is not JSON"):
        list(iter_documents(source_files([SourceSpec("jsonl", [str(tmp_path / "e.jsonl")])])))
