"""One BLAS thread per task while a pass runs tasks side by side in this process.

A pass without a Client calls its tasks on a pool of threads (:class:`~gdask.gdataset.engine._client.LocalPasses`).
Where a task calls BLAS (the multinomial logistic loss's matrix products), each of N tasks would start
an N-threaded BLAS call on N cores: N^2 threads, and OpenBLAS's threads spin while they wait for work
(300k x 50 rows, 3 classes, 2 cores: 95 ms a pass with 2 BLAS threads a task, 35 with one). The tasks
are already the parallelism, so their BLAS runs on one thread each, as on ``distributed``'s workers (a
nanny starts them with ``OPENBLAS_NUM_THREADS=1`` and friends).

The limit is the process's (BLAS libraries keep one thread count for all threads): passes that
overlap, from two fits in two threads, share it. The first to enter sets it, the last to leave gives the
libraries back their own setting.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["OneBlasThread"]


class OneBlasThread:
    """``with limit:`` or :meth:`hold` / :meth:`release` (re-entrant, from any thread): BLAS libraries
    run one thread a call while a hold lasts.

    One instance for the process (:data:`ONE_BLAS_THREAD`): the setting it changes is the process's.
    Without ``threadpoolctl``, or where it cannot set a library, nothing changes (logged at debug
    level).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._controller: Any = None
        self._limited: Any = None  # threadpoolctl's limiter while inside

    def hold(self) -> None:
        """Limit BLAS to one thread a call, until as many :meth:`release` calls as holds."""
        with self._lock:
            if self._depth == 0:
                self._limited = self._limit()
            self._depth += 1

    def release(self) -> None:
        """End one :meth:`hold`; the last gives the libraries back their own setting."""
        with self._lock:
            if self._depth == 0:
                raise RuntimeError("OneBlasThread.release() without a hold()")
            self._depth -= 1
            if self._depth == 0 and self._limited is not None:
                limited, self._limited = self._limited, None
                limited.restore_original_limits()

    def __enter__(self) -> OneBlasThread:
        self.hold()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _limit(self) -> Any:
        try:
            if self._controller is None:  # finds the loaded libraries once (2-9 ms); a limit then costs ~25 us
                from threadpoolctl import ThreadpoolController

                self._controller = ThreadpoolController()
            return self._controller.limit(limits=1, user_api="blas")
        except Exception as e:  # noqa: BLE001 - the limit is an optimisation: the pass runs without it
            logger.debug("BLAS thread limit not set: %s", e)
            return None

    @property
    def active(self) -> bool:
        """Whether a pass holds the limit now."""
        return self._depth > 0


#: the process's limit (BLAS libraries keep one thread count per process)
ONE_BLAS_THREAD = OneBlasThread()
