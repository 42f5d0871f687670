"""The recorder process takes the answers that come close together and records them in a row (issue 24 item 5):
handed to the writer one at a time, ~13 ms apart, each woke its threads on its own (GIL hand-overs that were ~30%
of the recorder's Python time)."""

from __future__ import annotations

import multiprocessing
import threading
import time

from tokview.proxy.recorder_process import gather


def test_answers_that_come_within_the_window_are_taken_together_and_an_ending_pipe_keeps_them() -> None:
    jobs, feed = multiprocessing.Pipe(duplex=False)

    def send() -> None:
        for n in range(5):
            feed.send(("answer", n))
            time.sleep(0.01)
        time.sleep(0.3)
        feed.send(("answer", 5))
        feed.close()

    sender = threading.Thread(target=send)
    sender.start()
    first, ended = gather(jobs, 5.0, window_s=0.2)
    assert (first, ended) == ([("answer", n) for n in range(5)], False)
    second, ended = gather(jobs, 5.0, window_s=0.2)
    sender.join()
    assert (second, ended) == ([("answer", 5)], True)
    assert gather(jobs, 0.01) == ([], True)


def test_a_burst_is_taken_at_most_a_few_dozen_at_a_time() -> None:
    jobs, feed = multiprocessing.Pipe(duplex=False)
    for n in range(10):
        feed.send(n)
    assert gather(jobs, 1.0, window_s=1.0, most=4) == ([0, 1, 2, 3], False)
    assert gather(jobs, 1.0, window_s=0.0, most=4) == ([4, 5, 6, 7], False)  # what is there already, no wait
    assert gather(jobs, 1.0, window_s=0.0, most=4) == ([8, 9], False)
