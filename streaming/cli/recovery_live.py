"""The recovery demo's live line, once a second: what the producers sent and committed, what the
real topic shows released, what the history shows rolled back, what is still pending, and the
coordinator's state (starting, running, DOWN, recovering, CAUGHT UP, broker paused). The
crash and the recovery are marked by lines of their own, between them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from txstream.state.effects import NoteKind
from txstream.streaming.cli.recovery_ledger import Ledger
from txstream.streaming.cli.recovery_watch import TopicWatch

__all__ = ["say", "Live"]

# The live line and the marks come from two threads; print() writes the text and its newline
# separately, so two lines could run into one.
_LOCK = threading.Lock()


def say(text: str) -> None:
    with _LOCK:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Live:
    """The line, printed once a second while :meth:`printing`."""

    def __init__(self, ledger: Ledger, watch: TopicWatch) -> None:
        self.ledger, self.watch = ledger, watch
        self.state = "starting"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def line(self) -> str:
        sent, committed = self.ledger.sent(), self.ledger.committed()
        visible = set(self.watch.copies())
        ended = self.watch.ended_otherwise()
        rolled = sum(1 for t in sent if ended.get(t) == NoteKind.ROLLED_BACK)
        pending = sum(1 for t in sent if t not in visible and t not in ended)
        line = (f"sent {len(sent)} | committed {len(committed)} | released "
                f"{len(committed & visible)} | rolled back {rolled} | pending {pending} | "
                f"coordinator {self.state}")
        if self.state == "CAUGHT UP":  # said once, on the line after it happened
            self.state = "running"
        return line

    def mark(self, text: str, state: str | None = None) -> None:
        """Say ``text``. With ``state``: enter it first, and print the line at once after the
        text, so that a state shorter than the line's second (a coordinator down for 1 s,
        under load) is still on a line."""
        if state is not None:
            self.state = state
        say(text)
        if state is not None:
            say(self.line())

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            say(self.line())

    @contextmanager
    def printing(self) -> Iterator[None]:
        self._thread = threading.Thread(target=self._run, name="recovery-live", daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
