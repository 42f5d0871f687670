"""The proxy relays its recorder child's lines until it says it leaves without the child (a second Ctrl-C): a
line the child said later (a "waiting for the store" a second into a held store's wait) came after the proxy's own
last line, "tokview: terminated", on the user's terminal after the proxy had gone (seen once in CI)."""

from __future__ import annotations

import threading

from tokview.proxy.recorder_process import Relay


def test_lines_are_said_until_the_proxy_leaves_and_none_after() -> None:
    said: list[str] = []
    relay = Relay(said.append)
    relay.say("tokview proxy: waiting for s.duckdb: in use by another program (pid 7)")
    relay.end()
    said.append("tokview: terminated")  # the proxy's last line
    relay.say("tokview proxy: the last answers are recorded but not landed")
    assert said == ["tokview proxy: waiting for s.duckdb: in use by another program (pid 7)", "tokview: terminated"]


def test_a_line_being_said_as_the_proxy_leaves_is_said_whole_before_the_proxy_goes_on() -> None:
    said: list[str] = []
    saying, may_finish = threading.Event(), threading.Event()

    def slow_say(line: str) -> None:  # a terminal that takes its time
        saying.set()
        may_finish.wait(5)
        said.append(line)

    relay = Relay(slow_say)
    reader = threading.Thread(target=relay.say, args=("child line",))
    reader.start()
    assert saying.wait(5)
    ended = threading.Event()

    def leave() -> None:
        relay.end()
        ended.set()

    leaving = threading.Thread(target=leave)
    leaving.start()
    assert not ended.wait(0.2)  # held until the line in progress is out
    may_finish.set()
    leaving.join(5)
    reader.join(5)
    said.append("tokview: terminated")
    assert said == ["child line", "tokview: terminated"]
