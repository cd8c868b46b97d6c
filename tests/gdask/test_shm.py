"""Arrays in shared-memory files (gdask._shm): what is written is what is read, in either layout."""

from __future__ import annotations

import numpy as np
import pytest

from gdask import _shm


@pytest.mark.parametrize("tile", [1, 24, 1000, 2 << 20])
def test_arrays_written_column_after_column_read_back_in_place(tmp_path, monkeypatch, tile):
    """``order="F"`` lays each 2-D array out column after column (a tile of rows and columns at a
    time: one row, tiles cut mid-array, wider than the array); 1-D arrays and arrays already
    feature-major keep their bytes, and every value is where it was, for every dtype."""
    monkeypatch.setattr(_shm, "_TILE_BYTES", tile)
    monkeypatch.setattr(_shm, "_TILE_COLUMNS", 3)  # several column tiles, the last one narrower
    rng = np.random.default_rng(0)
    arrays = [rng.random((101, 7)), rng.random((40, 2)).astype(np.float32), rng.integers(-5, 5, (33, 4)),
              rng.random((90, 12))[::3, 1:9], np.asfortranarray(rng.random((20, 5))), rng.random(17),
              np.zeros((0, 3)), rng.random((1, 8))]
    f = _shm.write(arrays, str(tmp_path), order="F")
    try:
        back = _shm.read(f)
        assert len(back) == len(arrays)
        for a, b in zip(arrays, back):
            got = b.reshape(a.shape, order="F")
            assert got.dtype == a.dtype and got.flags.f_contiguous
            np.testing.assert_array_equal(got, a)
        c = _shm.write(arrays, str(tmp_path), order="C")
        for a, b in zip(arrays, _shm.read(c)):
            np.testing.assert_array_equal(b.reshape(a.shape), a)
        _shm.remove(c.path)
    finally:
        _shm.remove(f.path)
    with pytest.raises(ValueError, match="order must be 'C' or 'F'"):
        _shm.write(arrays, str(tmp_path), order="K")
