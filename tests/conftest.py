import pathlib
import sys

import dask
import numpy as np
import pytest

# Worker processes unpickle functions defined in test modules by importing those modules: put the
# repository on the path (``pytest``, unlike ``python -m pytest``, does not); spawned workers start
# with this process's sys.path
_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

#: the device backends the suite runs on: NumPy blocks, and array-api-strict blocks on a non-CPU
#: device, which refuse to mix with NumPy arrays as CuPy's do (how CI checks the CUDA path's logic)
BACKENDS = ("emulated", "emulated-strict")


def _xps():
    out = [pytest.param(np, id="numpy")]
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        out.append(pytest.param(cupy, id="cupy", marks=pytest.mark.gpu))
    except Exception:  # noqa: BLE001 - no usable GPU
        pass
    return out


@pytest.fixture(params=_xps())
def xp(request):
    """Array module: numpy always, cupy where a GPU exists (tests marked gpu)."""
    return request.param


@pytest.fixture(params=BACKENDS)
def backend(request):
    """The device backend of the test: local computations (no Client) run on a device of this backend
    (config ``gdask.backend``), and :func:`bclient` is a client of a cluster of such devices."""
    with dask.config.set({"gdask.backend": request.param}):
        yield request.param


def _cluster_client(backend: str):
    from distributed import Client

    import gdask

    # not the default client: a test sees a cluster only when it asks for one (``client`` / ``bclient``
    # make theirs current), so tests without one run locally on their backend's device
    with gdask.LocalGPUCluster(n_devices=2, backend=backend, device_memory="512MiB",
                               dashboard_address=":0") as cluster, Client(cluster, set_as_default=False) as c:
        yield c


@pytest.fixture(scope="module")
def _emulated_client():
    yield from _cluster_client("emulated")


@pytest.fixture(scope="module")
def _strict_client():
    yield from _cluster_client("emulated-strict")


@pytest.fixture
def client(_emulated_client):
    """A client of a LocalGPUCluster with 2 emulated devices (one per module), current in the test."""
    with _emulated_client.as_current():
        yield _emulated_client


@pytest.fixture
def bclient(backend, request):
    """A client of a LocalGPUCluster with 2 devices of :func:`backend` (one per module and backend),
    current in the test."""
    c = request.getfixturevalue("_emulated_client" if backend == "emulated" else "_strict_client")
    with c.as_current():
        yield c
