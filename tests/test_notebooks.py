"""The notebooks run from top to bottom (nbclient) and show what they promise, on both emulated backends:
NumPy blocks (``emulated``) and array-api-strict blocks (``emulated-strict``, which refuse NumPy operands
and implicit conversion as CuPy arrays do: a notebook that passes there runs unchanged on GPUs). The
strict kernel gets ``DASK_GDASK__BACKEND=emulated-strict`` and its ``backend='emulated'`` arguments become
``backend='emulated-strict'``; both kernels run at once (they mostly wait on their clusters)."""

import asyncio
import importlib.util
import os
import re
import tempfile
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o["text"])
        else:
            out.extend(str(v) for v in o.get("data", {}).values())
    return "".join(out)


def _cell(nb, source_start: str):
    return next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith(source_start))


def _check_quickstart(nb):
    assert "persisted: all 8 blocks" in _text(_cell(nb, "rng = "))  # the repr once the blocks are persisted
    assert "<svg" in _text(_cell(nb, "rng = "))  # the block diagram
    fit = _text(_cell(nb, "km = "))
    assert "KMeans: " in fit and "iterations in" in fit and "'workers'" in fit  # bar + summary in the fit's cell
    assert "4.00 GiB" in _text(_cell(nb, "gdask.scheduling.device_table"))
    assert "labels agree" in _text(nb.cells[-1])


def _check_custom_loop(nb):
    assert "power iteration: " in _text(_cell(nb, "rng = "))
    assert "|cos| with numpy eigh: 1.0000000" in _text(_cell(nb, "top = "))
    assert "image/png" in str(_cell(nb, "import gdask.plot").outputs)
    assert "reused" in _text(nb.cells[-1])


def _check_unequal(nb):
    assert "device_speeds" in nb.cells[1].source and "0.5" in _text(nb.cells[1])  # the cluster lists its speeds
    assert "image/png" in str(_cell(nb, "import time").outputs)


def _check_larger(nb):
    assert "host tier" in _text(_cell(nb, "x = "))  # blocks in host memory, marked in the diagram
    assert "hit rate after the first pass" in _text(_cell(nb, "later = "))
    stats = _text(_cell(nb, "stats = "))
    assert "gdask window cache" in stats and "<svg" in stats and "0.0% of 0 reads" not in stats
    assert "moved to the devices" in _text(_cell(nb, "km = "))  # streaming K-means reports bytes moved


def _check_sharing(nb):
    assert "jobs done: " in _text(nb.cells[-1])
    table = _text(_cell(nb, "with gdask.job"))
    assert "64.00 MiB" in table and "tcp://" not in table.split("gdask jobs")[-1].split("</table>")[0]


def _check_more_estimators(nb):
    for name in ("PCA", "TruncatedSVD", "LinearRegression", "Ridge", "Lasso", "ElasticNet", "GaussianMixture"):
        assert f"{name} agrees with scikit-learn: True" in "".join(_text(c) for c in nb.cells if c.cell_type == "code")
    assert "fit on the workers" in _text(_cell(nb, "pca = "))
    assert "GDataSet" in _text(_cell(nb, "pca = "))  # the lazy transform, blocked like X
    assert "lower bound" in _text(_cell(nb, "means = "))


CHECKS = {"01-quickstart.ipynb": _check_quickstart, "02-custom-loop.ipynb": _check_custom_loop,
          "03-unequal-devices.ipynb": _check_unequal, "04-larger-than-memory.ipynb": _check_larger,
          "05-sharing.ipynb": _check_sharing, "06-more-estimators.ipynb": _check_more_estimators}


def test_every_notebook_has_checks():
    assert sorted(CHECKS) == [p.name for p in NOTEBOOKS]


#: the device backends every notebook runs on
BACKENDS = ("emulated", "emulated-strict")


def for_backend(nb, backend: str):
    """The notebook ``nb`` with its explicit ``backend='emulated'`` arguments set to ``backend``."""
    for c in nb.cells:
        if c.cell_type == "code":
            c.source = re.sub(r"""backend=(["'])emulated\1""", lambda m: f"backend={m.group(1)}{backend}{m.group(1)}",
                              c.source)
    return nb


#: seconds a cell may run before its kernel is interrupted (a cell takes under 30 s here, also under
#: load): the KeyboardInterrupt's traceback, in the failure, shows where a stuck cell waited
CELL_TIMEOUT = 150


def _where(nb) -> str:
    """The code cell of ``nb`` a dead or stuck kernel was in: the first that did not finish."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    i = next((i for i, c in enumerate(code) if c.get("execution_count") is None and not c.get("outputs")),
             len(code) - 1)
    return f"code cell {i + 1} of {len(code)} ({code[i].source.splitlines()[0][:60]!r})" if code else "no cell"


def _exit_status(km) -> str:
    """How a kernel process ended: its exit code, or the signal that killed it (SIGKILL: the
    OOM killer or an outside kill; SIGSEGV/SIGABRT: a crash, whose stack PYTHONFAULTHANDLER wrote
    to the test's captured stderr)."""
    import signal

    proc = getattr(getattr(km, "provisioner", None), "process", None)
    code = proc.poll() if proc is not None else None
    if code is None:
        return "exit status unknown"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _memory() -> str:
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return f"MemAvailable {info['MemAvailable'].strip()} of {info['MemTotal'].strip()}"
    except (OSError, KeyError, ValueError):
        return "memory unknown"


def _kernel_manager(where: str, blocking: bool = False):
    """A kernel manager (ours, to read the process's exit status if it dies) whose kernel talks over
    Unix sockets in the directory ``where`` (``k-1`` .. ``k-5``), not TCP ports. The manager picks free TCP ports
    and the kernel binds them later; in between another process can take one (the other kernel's
    cluster starts at the same time, and so do the clusters of other tests' processes), and the kernel
    then dies before replying ("Address already in use", seen under load). ``blocking``: a manager
    whose methods return their results (for ``NotebookClient.execute``), not coroutines."""
    from jupyter_client.manager import AsyncKernelManager, KernelManager

    return (KernelManager if blocking else AsyncKernelManager)(kernel_name="python3", transport="ipc",
                                                                 ip=os.path.join(where, "k"))


def _socket_dir() -> tempfile.TemporaryDirectory:
    """A new directory for a kernel's sockets, short (a Unix socket's path holds ~100 bytes), removed
    by its ``cleanup()``."""
    return tempfile.TemporaryDirectory(prefix="gdask-nb-", ignore_cleanup_errors=True)


async def _execute(nb, backend: str, where: Path) -> float:
    where.mkdir()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # a crashing kernel writes its threads' stacks to stderr
    if backend != "emulated":  # the emulated kernel keeps the default backend ("auto": emulated without a GPU)
        env["DASK_GDASK__BACKEND"] = backend
    sockets = _socket_dir()
    km = _kernel_manager(sockets.name)
    client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, interrupt_on_timeout=True,
                                     resources={"metadata": {"path": str(where)}})
    t0 = time.perf_counter()
    try:
        await client.async_execute(env=env)
    except nbclient.exceptions.DeadKernelError as e:
        raise nbclient.exceptions.DeadKernelError(
            f"{e} in {_where(nb)} after {time.perf_counter() - t0:.1f} s: {_exit_status(km)}; {_memory()}") from e
    finally:
        if client.kc is not None:  # the client's channels (a kernel manager of ours keeps them open)
            client.kc.stop_channels()
        if km.has_kernel:
            if await km.is_alive():
                await km.shutdown_kernel(now=True)
            else:
                await km.cleanup_resources()
        sockets.cleanup()
    return time.perf_counter() - t0


async def _execute_all(nbs: dict, tmp_path: Path) -> list:
    return await asyncio.gather(*(_execute(nb, b, tmp_path / b) for b, nb in nbs.items()), return_exceptions=True)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
    nbs = {b: for_backend(nbformat.read(path, as_version=4), b) for b in BACKENDS}
    results = asyncio.run(_execute_all(nbs, tmp_path))
    failed = [f"{b}: {type(r).__name__}: {r}" for b, r in zip(nbs, results) if isinstance(r, BaseException)]
    assert not failed, "\n".join(failed)
    for (backend, nb), seconds in zip(nbs.items(), results):
        print(f"{path.name} on {backend}: {seconds:.1f} s")
        if os.environ.get("GDASK_NOTEBOOKS_OUT"):  # keep the executed notebook (to look at its outputs)
            nbformat.write(nb, Path(os.environ["GDASK_NOTEBOOKS_OUT"]) / f"{backend}-{path.name}")
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.get("output_type") == "error"], backend
        CHECKS[path.name](nb)


# -- the progress of a fit lands in the cell that runs the fit, not in the cell that made the Client --
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

# well separated blobs: K-means converges long before max_iter
CELL_CONVERGES = """\
rng = np.random.default_rng(1)
c = rng.uniform(-20, 20, (4, 8)).astype("float32")
y = (c[rng.integers(0, 4, 20_000)] + rng.standard_normal((20_000, 8), dtype="float32"))
Y = gdask.from_array(y, block_rows=5_000).persist()
km2 = gdask.ml.KMeans(4, random_state=0, max_iter=300, verbose=True).fit(Y)
print("n_iter", km2.n_iter_)
"""

CELL_CLOSE = "client.close(); cluster.close()"


def _widget_bars(nb) -> list[dict]:
    """The saved state of the notebook's progress-bar widgets (ipywidgets' Int/FloatProgress models)."""
    state = (nb.metadata.get("widgets") or {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return [m["state"] for m in state.values() if m.get("model_name") in ("IntProgressModel", "FloatProgressModel")]


def test_verbose_fit_on_the_workers_reports_in_the_cell_running_the_fit():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (CELL_CLIENT, CELL_FIT, CELL_CONVERGES, CELL_CLOSE)]
    sockets = _socket_dir()
    km = _kernel_manager(sockets.name, blocking=True)
    client = nbclient.NotebookClient(nb, km=km, timeout=240)
    try:
        client.execute()
    finally:  # a kernel manager of ours: the client leaves its kernel running
        if client.kc is not None:
            client.kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        sockets.cleanup()
    first, second, third = _text(nb.cells[0]), _text(nb.cells[1]), _text(nb.cells[2])
    assert "client ready" in first
    assert "KMeans" not in first and "iteration" not in first  # nothing leaked into the Client's cell
    assert "fit mode workers" in second  # the loop ran on the workers ...
    assert "8/" in second  # ... and its bar reached 8 iterations in this cell
    assert "KMeans: 8 iterations in" in second and "loop: workers" in second  # the summary line
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    # the early-converging fit: its bar says so, full and (as a widget) green, in the saved text too
    n_iter = int(third.split("n_iter ")[1].split()[0])
    assert 1 < n_iter < 300
    assert f"KMeans converged at iteration {n_iter}" in third and f"{n_iter}/{n_iter}" in third
    assert "0/300" not in third.replace(f"{n_iter}/{n_iter}", "")  # the saved text is the bar's last state
    if importlib.util.find_spec("ipywidgets") is not None:  # widget bars: their saved style
        bars = _widget_bars(nb)
        assert len(bars) == 2, bars
        assert [b.get("bar_style") for b in bars] == ["success", "success"]  # never 'danger'
        assert sorted((b["value"], b["max"]) for b in bars) == sorted([(8, 8), (n_iter, n_iter)])
