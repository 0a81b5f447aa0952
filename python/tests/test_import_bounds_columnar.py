"""Long PyTorch trace CSVs go through the columnar reader; it keeps the import bounds too."""
from __future__ import annotations

import gzip
import os

import pytest

from vramkit.trace import fast_csv, limits
from vramkit.trace.importers import load_trace


def _big_csv(path, rows: int) -> None:
    with open(path, "w") as f:
        f.write("t_us,action,addr,size,stream\n")
        for i in range(rows):
            a = 1 << 20 | (i % 1000) << 12
            f.write(f"{2 * i},alloc,{a},4096,0\n{2 * i + 1},free_requested,{a},4096,0\n")
    assert os.path.getsize(path) >= fast_csv.FAST_MIN_BYTES


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    p = tmp_path_factory.mktemp("bounds") / "long.trace.csv"
    _big_csv(p, 80_000)
    return p


def test_a_long_csv_within_the_bounds_reads(big):
    t = load_trace(big)
    assert len(t.ops) == 160_000


def test_too_many_events_in_a_long_csv_is_refused(big, monkeypatch):
    monkeypatch.setenv("VRAMKIT_MAX_IMPORT_EVENTS", "1000")
    with pytest.raises(ValueError, match=r"more than 1000 events.*--max-import-events"):
        load_trace(big)


def test_too_many_bytes_in_a_long_csv_is_refused(big, monkeypatch):
    monkeypatch.setenv("VRAMKIT_MAX_IMPORT_BYTES", "1MiB")
    with pytest.raises(ValueError, match=r"more than 1048576 bytes.*--max-import-bytes"):
        load_trace(big)


def test_a_gzip_of_zeros_is_refused_by_the_bound_not_by_memory(tmp_path, monkeypatch):
    # Over the size where the columnar reader takes over, and one endless line: it declines at
    # 64 KiB, and the row reader stops at the byte bound.
    p = tmp_path / "zeros.trace.csv.gz"
    with gzip.open(p, "wb", compresslevel=1) as f:
        f.write(b"t_us,action,addr,size,stream\n")
        block = os.urandom(1 << 20)  # incompressible, so the file passes FAST_MIN_BYTES
        for _ in range(6):
            f.write(block.replace(b"\n", b"x"))
    assert os.path.getsize(p) >= fast_csv.FAST_MIN_BYTES
    monkeypatch.setenv("VRAMKIT_MAX_IMPORT_BYTES", "2MiB")
    with pytest.raises(ValueError, match="more than 2097152 bytes|line"):
        load_trace(p)


def test_columnar_readers_have_their_own_default():
    assert limits.max_events(columnar=True) > limits.max_events() >= 5_000_000
