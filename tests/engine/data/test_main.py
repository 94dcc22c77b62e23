"""`python -m engine.data prepare ... --out DIR` and `verify DIR`: the platform's prepare
without the platform."""

from __future__ import annotations

import json

from engine.data.__main__ import guess_kind, main
from tests.engine.data.test_prepare import corpus


def test_prepare_then_verify_from_the_command_line(tmp_path, capsys):
    texts = corpus(tmp_path / "src", documents=3)
    out = tmp_path / "out"
    assert main(["prepare", str(tmp_path / "src" / "*.txt"), "--out", str(out),
                 "--holdout", "0.4", "--workers", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["splits"]["heldout"] == {"tokens": len(texts[1]) + 1, "documents": 1}
    assert main(["verify", str(out)]) == 0
    shard = out / "train" / "shard-00000.bin"
    shard.write_bytes(shard.read_bytes()[::-1])
    assert main(["verify", str(out)]) == 1
    assert "does not match its checksum" in capsys.readouterr().err


def test_the_kind_follows_the_extension():
    assert [guess_kind(p) for p in ("a/*.jsonl", "s3://b/x.parquet", "notes/*.md")] == [
        "jsonl", "parquet", "text"]
