"""Issue #48, Low: a Ray Train failure that carries a pid, a port or an id was never "the same failure" twice, so a
deterministic error was restarted target.max_failures times. Compared with those made neutral, it stops after two.
(The whole path, on a real local cluster: tests/test_cluster_hangs.py's deterministic-error test.)"""

from __future__ import annotations

import pytest

from ortlab.job.raytrain import FAILURES_FILE, WORKERS_FILE, _same_failure_without_a_step, failure_signature
from ortlab.runfolder.rundir import RunDir


def _failed_twice(tmp_path, first: str, second: str) -> str | None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.append_records(
        WORKERS_FILE,
        [{"job": "j", "attempt": a, "rank": 0, "step": run.last_step()} for a in range(3)],
    )
    run.append_records(
        FAILURES_FILE,
        [{"time": 1.0, "job": "j", "workers": {"0": first}}, {"time": 2.0, "job": "j", "workers": {"0": second}}],
    )
    return _same_failure_without_a_step(run, run, "j", attempt=2)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            "RuntimeError: worker pid=4242 lost its connection to 127.0.0.1:40123",
            "RuntimeError: worker pid=5119 lost its connection to 127.0.0.1:38807",
        ),
        (
            "ActorDiedError: actor 8f3c2a1b9d0e4f5a6b7c8d9e died on node 1a2b3c4d5e6f7a8b (at 2026-11-28 10:11:12.345)",
            "ActorDiedError: actor 0d9c8b7a6f5e4d3c2b1a0f9e died on node 9f8e7d6c5b4a3f2e (at 2026-11-28 10:11:49.012)",
        ),
        (
            "OSError: [Errno 98] Address already in use: [::1]:29500",
            "OSError: [Errno 98] Address already in use: [::1]:29517",
        ),
        ("ValueError: object at 0x7f3a2b1c0d90 is not a model", "ValueError: object at 0x7f11aa22bb30 is not a model"),
    ],
)
def test_a_repeated_failure_that_carries_volatile_numbers_stops_the_restarts(tmp_path, first, second):
    why = _failed_twice(tmp_path, first, second)
    assert why is not None and "failed twice in a row with the same error" in why, why
    assert second in why, "the message quotes the last failure as it was"


def test_different_failures_are_still_different(tmp_path):
    assert _failed_twice(tmp_path, "OSError: no such file: model.bin", "KeyError: 'labels'") is None
    assert failure_signature("worker pid=1 on 10.0.0.7:6379") == failure_signature("worker pid=99 on 10.0.0.8:6380")
    assert failure_signature("CUDA out of memory") != failure_signature("NCCL timeout")
