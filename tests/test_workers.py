"""The suite's scheduling over two processes: the seconds each file took, read from a run's
JUnit XML, order the files the longest first (tests/workers.py)."""

import json

from tests import workers


def test_a_runs_seconds_are_summed_per_file_and_the_namespace_files_count_as_one(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_workers" name="a" time="1.5"/>
      <testcase classname="tests.test_workers" name="b" time="2.0"/>
      <testcase classname="tests.platform.hosts.test_cluster" name="c" time="4.0"/>
      <testcase classname="tests.platform.jobs.test_multi_host" name="d" time="6.0"/>
    </testsuite></testsuites>""")
    assert workers.seconds_per_file(junit) == {"network namespaces": 10.0,
                                               "tests/test_workers.py": 3.5}


def test_the_recorded_durations_name_only_files_that_exist():
    recorded = json.loads(workers.DURATIONS.read_text())
    gone = [name for name in recorded
            if name != "network namespaces" and not (workers.ROOT / name).exists()]
    assert not gone, f"refresh tests/durations.json (python -m tests.workers): {gone}"
