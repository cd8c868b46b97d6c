import subprocess
import sys


def test_import_without_cuda_is_fast_and_lazy():
    code = (
        "import sys, time; t=time.perf_counter(); import gdask; dt=time.perf_counter()-t;"
        "assert 'cupy' not in sys.modules and 'rmm' not in sys.modules and 'pynvml' not in sys.modules;"
        "assert 'gdask.gdataset' not in sys.modules; print(dt)"
    )
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 5.0


def test_public_names():
    import gdask

    for name in gdask.__all__:
        assert getattr(gdask, name) is not None
