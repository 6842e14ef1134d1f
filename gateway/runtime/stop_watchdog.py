"""A stop that cannot hang: once asked to stop, the process is gone within a budget.

``shutdown_timeout`` bounds the gateway's own stop, but a call inside a client library
that never returns (librdkafka closing a consumer after a broker restart, say) sits in
a thread that Python joins at exit, so a stopped gateway could stay alive until
something SIGKILLs it. The watchdog ends the process ``grace_s`` after the budget:
everything the gateway keeps is crash-safe (MQ units of work back out, the stores
commit their transactions), so leaving a stuck thread behind loses nothing that a
SIGKILL would not. It logs which threads were stuck and their stacks first.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

#: Exit status when the watchdog ends a stop the gateway had not finished.
OVERRAN_EXIT = 1
#: Seconds after the budget at which faulthandler ends the process if the watchdog's
#: own thread could not.
BACKSTOP_S = 5.0


class StopWatchdog:
    """Armed when a stop is asked for; fires once, ``budget_s`` later, unless the
    process has exited by then."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        #: the exit status the stop produced, once it finished (the process may still be
        #: waiting for threads at that point)
        self.exit_code: int | None = None
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        """Start the countdown (again: the first arm counts)."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(self.budget_s, self._fire)
        self._timer.name = "stop-watchdog"
        self._timer.daemon = True  # never what keeps the process alive
        self._timer.start()
        # The backstop, should the timer thread itself not get to run (the interpreter
        # lock held by a stuck call, a log write blocked on a full pipe): faulthandler's
        # own C thread dumps the stacks and exits with OVERRAN_EXIT, BACKSTOP_S later.
        with contextlib.suppress(ValueError, RuntimeError, OSError, AttributeError):
            faulthandler.dump_traceback_later(self.budget_s + BACKSTOP_S, exit=True)

    def finished(self, exit_code: int) -> None:
        """The stop itself is done with ``exit_code``; only exiting is left."""
        self.exit_code = exit_code
        self.arm()

    def _fire(self) -> None:
        code = self.exit_code if self.exit_code is not None else OVERRAN_EXIT
        try:
            self._report()
        finally:  # whatever the report met (stderr closed, a handler failing): exit
            os._exit(code)

    def _report(self) -> None:
        main = threading.main_thread()
        stuck = sorted(
            t.name for t in threading.enumerate()
            if t is not main and t is not threading.current_thread() and t.is_alive()
            and not t.daemon
        )
        done = self.exit_code is not None
        log.error(
            "the stop overran %.0f s (%s); threads still busy: %s; their stacks follow, "
            "then the process exits without them (nothing is lost: every store and unit "
            "of work is crash-safe)",
            self.budget_s,
            "gateway stopped, waiting for threads" if done else "gateway still stopping",
            ", ".join(stuck) or "(none)",
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
