"""The response thread of a streaming model: the batcher never waits for Triton."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from .sequences import Finish, Sequence, add_pending


class Responder:
    """Sends every sequence's text on its own thread, so the batcher never waits for Triton: pieces produced
    while a sequence's previous response is still being sent go out together as one response (a slow send costs
    fewer sends, not a backlog). It also asks Triton whether clients are gone -- after each send, and every
    POLL_S for every open sequence (one waiting for a place gets nothing sent) -- and sets `sequence.gone`, so the
    batcher reads a flag instead of asking Triton for every row at every step. `emit` failing ends that sequence."""

    POLL_S = 0.1

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log
        self.lock = threading.Lock()
        self.open: set[Sequence] = set()
        self.queue: collections.deque[Sequence | None] = collections.deque()
        self.ready = threading.Condition(self.lock)
        self.last_poll = 0.0
        self.thread = threading.Thread(target=self._run, name="hf2triton-responses", daemon=True)
        self.thread.start()

    def watch(self, sequence: Sequence) -> None:
        with self.lock:
            self.open.add(sequence)

    def post(self, sequence: Sequence, text: str, finish: Finish | None = None) -> None:
        with self.lock:
            if add_pending(sequence, text, finish):
                self.queue.append(sequence)
                self.ready.notify()

    def stop(self) -> None:
        with self.lock:
            self.queue.append(None)
            self.ready.notify()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.ready.wait(self.POLL_S)
                sequence = self.queue.popleft() if self.queue else False
                if sequence:
                    text, finish = "".join(sequence.pieces), sequence.finish
                    sequence.pieces.clear()
                    sequence.queued = False
                    if finish is not None:
                        self.open.discard(sequence)
            if sequence is None:
                return
            if sequence:
                self._send(sequence, text, finish)
            if time.monotonic() - self.last_poll > self.POLL_S:
                self._poll()

    def _send(self, sequence: Sequence, text: str, finish: Finish | None) -> None:
        try:
            sequence.emit(text, finish)
            if finish is None and not sequence.gone and sequence.cancelled():
                sequence.gone = True
        except Exception as err:  # noqa: BLE001 - a failed send ends that sequence, not the thread
            self.log(f"hf2triton: sending a response failed: {type(err).__name__}: {err}")
            sequence.gone = True

    def _poll(self) -> None:
        self.last_poll = time.monotonic()
        with self.lock:
            sequences = [s for s in self.open if not s.gone and s.finish is None]
        for sequence in sequences:
            sequence.gone = self.ask(sequence)

    @staticmethod
    def ask(sequence: Sequence) -> bool:
        """Whether Triton says the sequence's client is gone (any thread)."""
        try:
            return bool(sequence.cancelled())
        except Exception:  # noqa: BLE001 - a request Triton no longer knows is gone as well
            return True
