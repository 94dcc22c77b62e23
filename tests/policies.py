"""Fault policies the test jobs run under."""

# The fault policy of the test jobs on two or more ranks that are not about stragglers. This
# machine's two cores are shared by the browser, the servers, the worker and the ranks, and a
# rank starved of CPU for a while is a real straggler by the detector's rule (rank 0 measured
# 2.5-4x the other's compute under load): the default ladder would restart the run (from
# step 0 when it keeps no checkpoint) and then pause it for a person, which is right for a
# user's job and beside the point of these tests.
OBSERVE_STRAGGLERS = {"policy": {"actions": {"straggler": ["observe"]}}}


def paced(ranks: int, factor: float = 10.0, until: int | None = None) -> dict:
    """OBSERVE_STRAGGLERS for a job that only has to keep running while a test steers it:
    every rank's forward is stretched `factor` times from the first step (to step `until`,
    if given), asleep (evenly: no rank is a straggler), so the ranks leave the cores to the
    browser and the other tests."""
    bound = {} if until is None else {"until": until}
    return {**OBSERVE_STRAGGLERS, "inject": [
        {"kind": "slow_rank", "step": 1, "rank": rank, "factor": factor, **bound}
        for rank in range(ranks)]}
