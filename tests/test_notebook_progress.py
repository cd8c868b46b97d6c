"""The progress of a fit lands in the notebook cell that runs the fit, not in the cell that made the Client."""

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CELL_CLIENT = """\
import numpy as np
import gdask
from distributed import Client
cluster = gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="256MiB", dashboard_address=":0")
client = Client(cluster)
print("client ready")
"""

CELL_FIT = """\
x = np.random.default_rng(0).standard_normal((20_000, 8)).astype("float32")
X = gdask.from_array(x, block_rows=5_000).persist()
km = gdask.ml.KMeans(4, random_state=0, max_iter=8, tol=0, verbose=True).fit(X)
print("fit mode", km.fit_mode_)
"""

CELL_CLOSE = "client.close(); cluster.close()"


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o["text"])
        else:
            out.extend(str(v) for v in o.get("data", {}).values())
    return "".join(out)


def test_verbose_fit_on_the_workers_reports_in_the_cell_running_the_fit():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (CELL_CLIENT, CELL_FIT, CELL_CLOSE)]
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3").execute()
    first, second = _text(nb.cells[0]), _text(nb.cells[1])
    assert "client ready" in first
    assert "KMeans" not in first and "iteration" not in first  # nothing leaked into the Client's cell
    assert "fit mode workers" in second  # the loop ran on the workers ...
    assert "8/" in second  # ... and its bar reached 8 iterations in this cell
    assert "KMeans: 8 iterations in" in second and "loop: workers" in second  # the summary line
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
