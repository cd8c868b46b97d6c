"""``python -m gdask ...``: the ``gdask`` command (e.g. ``python -m gdask worker SCHEDULER``, which is what
dask-jobqueue runs with ``worker_command="gdask worker"``)."""

import sys

from gdask._cli import main

sys.exit(main())
