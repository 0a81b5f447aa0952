"""Writing a file so that it is either whole or absent: never half-written."""
from __future__ import annotations

import os
import tempfile


def write_atomic(path, data: bytes | str) -> str:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsync it, then
    rename it over ``path``; on any error the temporary file is removed and ``path`` is untouched.
    The file gets the usual permissions (0666 less the umask). Returns the path."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
