"""Prometheus text format of the latest aggregates, served over HTTP."""

from __future__ import annotations

import re
import urllib.request

import pytest

from engine.xputimer import MetricsServer, OpAggregator, OpTimer, render_prometheus

# text exposition format 0.0.4: HELP/TYPE comments, then `name{label="value",...} number`
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"^({_NAME})(\{{{_LABEL}(?:,{_LABEL})*\}})? (\S+)$")
_HELP = re.compile(rf"^# HELP ({_NAME}) .+$")
_TYPE = re.compile(rf"^# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)$")


def parse_exposition(text: str) -> dict[str, list[tuple[str, float]]]:
    """Strict parser: every line well formed, samples after their family's TYPE line."""
    assert text.endswith("\n")
    families: dict[str, list[tuple[str, float]]] = {}
    typed = None
    for line in text.splitlines():
        if m := _HELP.match(line):
            continue
        if m := _TYPE.match(line):
            assert m[1] not in families, f"family {m[1]} declared twice"
            typed = m[1]
            families[typed] = []
            continue
        m = _SAMPLE.match(line)
        assert m, f"malformed line: {line!r}"
        assert m[1] == typed, f"sample {m[1]} outside its family"
        families[typed].append((m[2] or "", float(m[3])))
    return families


def aggregate() -> dict:
    timer = OpTimer()
    with timer.op("expert_mlp", kind="matmul", flops=1 << 20):
        pass
    with timer.op('grad "sync"', kind="collective", nbytes=1 << 16, group="global",
                  algo="ring", collective="all_reduce", group_size=2):
        pass
    return OpAggregator().aggregate(timer.step_end(7))


def test_render_is_well_formed_and_carries_ops_and_ranks():
    families = parse_exposition(render_prometheus(aggregate(), job="run-1"))
    assert families["ringside_step"] == [('{job="run-1"}', 7.0)]
    ops = dict(families["ringside_op_total_ms"])
    assert set(ops) == {'{job="run-1",op="expert_mlp",kind="matmul",group=""}',
                        '{job="run-1",op="grad \\"sync\\"",kind="collective",group="global"}'}
    assert len(families["ringside_op_tflops"]) == 1
    assert len(families["ringside_op_busbw_gbps"]) == 1
    assert families["ringside_op_rank_ms"][0][0].endswith('rank="0"}')
    assert [label for label, _ in families["ringside_rank_step_ms"]] == ['{job="run-1",rank="0"}']


def test_server_serves_the_latest_aggregate():
    server = MetricsServer(job="run-1").start()
    try:
        server.update(aggregate())
        with urllib.request.urlopen(server.url, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            families = parse_exposition(response.read().decode())
        assert families["ringside_step"][0][1] == 7.0
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=5)
    finally:
        server.stop()
