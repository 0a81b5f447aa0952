"""Where ``-o`` and the other writers put their file: never over a device node, FIFO or a hard
link, through a symlink to its target, and with the mode an existing file had."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest_trace as ct  # noqa: E402

ct.import_vramkit_pure()

from vramkit._atomic import write_atomic  # noqa: E402
from vramkit.trace import TraceBuilder, write_v1  # noqa: E402

TINY_CSV = "t_us,action,addr,size,stream\n1,alloc,4096,1048576,0\n2,free_requested,4096,1048576,0\n"


def _tiny_trace():
    b = TraceBuilder("tiny", "test")
    b.alloc(1, 1 << 20)
    b.free(1)
    return b.build()


def test_symlink_is_written_through(tmp_path):
    target = tmp_path / "target.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to("target.html")
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == "target.html"
    assert target.read_text() == "new"
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to("made.html")
    write_atomic(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "made.html").read_text() == "x"


def test_existing_mode_is_kept(tmp_path):
    secret = tmp_path / "secret.html"
    secret.write_text("s")
    secret.chmod(0o600)
    write_atomic(secret, "report")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text() == "report"
    write_v1(secret, _tiny_trace())
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_hard_link_fifo_and_device_are_refused(tmp_path):
    a = tmp_path / "a.html"
    a.write_text("keep")
    os.link(a, tmp_path / "b.html")
    with pytest.raises(OSError, match="a.html has 2 hard links"):
        write_atomic(a, "x")
    assert a.read_text() == "keep"
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="fifo.html is a FIFO"):
        write_atomic(fifo, "x")
    with pytest.raises(OSError, match="is a FIFO"):
        write_v1(fifo, _tiny_trace())
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(OSError, match="is a device node"):
        write_atomic("/dev/null", "x")
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_report_refuses_a_device_node_and_keeps_it(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TINY_CSV)
    try:
        os.mknod(tmp_path / "mynull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root")
    dev = tmp_path / "mynull"
    out = subprocess.run([sys.executable, "-m", "vramkit", "report", str(trace), "-o", str(dev),
                          "--no-progress", "--passes", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "mynull is a device node" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
