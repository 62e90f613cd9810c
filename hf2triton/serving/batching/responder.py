"""The response threads of a streaming model: the batcher never waits for Triton."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable

from .sequences import Finish, Sequence, add_pending, after_send, ask_if_gone, client_gone, take_pending


def response_threads() -> int:
    """Response threads for this machine: a piece's send (the stub's IPC round trip to the server) costs ~0.15 ms of
    mostly waiting, so one thread caps a model at ~6-7k responses/s and holds pieces of busy streams back (64
    streams: 8-12 pieces a response, ITL p50 8-13 ms for a 1 ms step). 4 threads send ~2x as many, 3-4 pieces
    each; on a small machine they take cores from the engine (2 cores: 0.85x the pieces/s), so one thread per 4
    cores, at most 4 (benchmarks/probes/response_sends.py)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores // 4))


class Responder:
    """Sends every sequence's text on its own threads, so the batcher never waits for Triton: pieces produced
    while a sequence's previous response is still being sent go out together as one response (a slow send costs
    fewer sends, not a backlog). A sequence is sent by one thread at a time (in order); different sequences on
    `threads` threads at once. Every POLL_S it asks Triton whether the clients of open sequences are gone (one that
    waits for a place gets nothing sent) and sets `sequence.gone`, so the batcher reads a flag instead of asking
    Triton for every row at every step (not after every send: that question is a second round trip per piece).
    `emit` failing ends that sequence."""

    POLL_S = 0.1

    def __init__(self, log: Callable[[str], None] = print, threads: int | None = None):
        self.log = log
        self.lock = threading.Lock()
        self.open: set[Sequence] = set()
        self.queue: collections.deque[Sequence | None] = collections.deque()
        self.ready = threading.Condition(self.lock)
        self.last_poll = 0.0
        count = threads or response_threads()
        # the first thread also polls for gone clients
        names = [f"hf2triton-responses-{index}" for index in range(count)]
        self.threads = [threading.Thread(target=self._run, args=(n == names[0],), name=n, daemon=True) for n in names]
        for thread in self.threads:
            thread.start()

    def watch(self, sequence: Sequence) -> None:
        with self.lock:
            self.open.add(sequence)

    def post(self, sequence: Sequence, text: str, finish: Finish | None = None) -> None:
        self.post_many([(sequence, text)], finish)

    def post_many(self, pieces: list[tuple[Sequence, str]], finish: Finish | None = None) -> None:
        """A step's pieces under one lock and one wake-up: 32 rows cost the batcher's thread 23-28 us instead of 50-63
        us posted one by one (2 cores), and the response threads start once they are all queued."""
        with self.lock:
            queued = 0
            for sequence, text in pieces:
                if add_pending(sequence, text, finish):
                    self.queue.append(sequence)
                    queued += 1
            self.ready.notify(queued)

    def stop(self) -> None:
        with self.lock:
            self.queue.extend([None] * len(self.threads))
            self.ready.notify_all()
        for thread in self.threads:
            thread.join(timeout=5)

    def _run(self, polls: bool) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.ready.wait(self.POLL_S)
                sequence = self.queue.popleft() if self.queue else False
                if sequence:
                    text, finish = take_pending(sequence)
                    if finish is not None:
                        self.open.discard(sequence)
            if sequence is None:
                return
            if sequence:
                self._send(sequence, text, finish)
                with self.lock:
                    if after_send(sequence, finish is not None):
                        self._requeue(sequence)
            if polls and time.monotonic() - self.last_poll > self.POLL_S:
                self._poll()

    def _send(self, sequence: Sequence, text: str, finish: Finish | None) -> None:
        try:
            sequence.emit(text, finish)
        except Exception as err:  # noqa: BLE001 - a failed send ends that sequence, not the thread
            self.log(f"hf2triton: sending a response failed: {type(err).__name__}: {err}")
            sequence.gone = True

    def _poll(self) -> None:
        self.last_poll = time.monotonic()
        with self.lock:
            sequences = [s for s in self.open if not s.gone and s.finish is None]
        for sequence in sequences:
            sequence.gone = sequence.gone or ask_if_gone(sequence, self.lock, sequence.cancelled, self._requeue)

    def _requeue(self, sequence: Sequence) -> None:  # the caller holds the lock
        self.queue.append(sequence)
        self.ready.notify()

    @staticmethod
    def ask(sequence: Sequence) -> bool:
        """Whether Triton says the sequence's client is gone (any thread)."""
        return client_gone(sequence.cancelled)
