"""What a Ray run says when a task fails, and when it stops for consecutive failures: plain logic, no Ray needed
(`tests/test_batch_ray.py` runs the real thing on a local Ray)."""

from __future__ import annotations

from tokview.batch.ray_shards import _Streak, task_error


class _RayTaskError(Exception):
    """Ray's wrapper: a coloured header line, the task's own exception as `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("\x1b[36mray::run_shard()\x1b[39m (pid=30728, ip=192.0.2.2)\n  File ...")
        self.cause = cause


def test_a_failed_task_is_said_by_its_own_exception_without_escape_sequences():
    assert task_error(_RayTaskError(ConnectionError("no server answered (http://127.0.0.1:9)"))) == (
        "no server answered (http://127.0.0.1:9)"
    )
    assert task_error(RuntimeError("\x1b[31mred\x1b[0m line\nmore")) == "red line"


def _shard(ok: int, failed: int, outcome: str | None = None) -> dict:
    return {"ok": ok, "failed": failed, "outcome": outcome, "reasons": {"HTTP 500": failed} if failed else {}}


def test_failures_add_up_across_shards_until_an_answer_and_a_stopped_shard_stops_the_run():
    streak = _Streak(20)
    for shard in (_shard(0, 16), _shard(3, 13), _shard(0, 16)):  # an answer in the second ends the streak
        streak.add(shard)
    assert streak.stop is None and streak.failures == 16
    streak.add(_shard(0, 16))
    assert streak.stop == "stopped after 32 consecutive failures (last: HTTP 500)"
    alone = _Streak(20)
    alone.add(_shard(2, 30, "stopped after 20 consecutive failures (last: HTTP 500)"))
    assert alone.stop == "stopped after 20 consecutive failures (last: HTTP 500)"
    never = _Streak(0)  # 0: no limit
    for _ in range(10):
        never.add(_shard(0, 16))
    assert never.stop is None
