"""Writing a file so that it is either whole or absent: never half-written.

The one writer of every file vramkit produces (reports, snapshots, v1 traces). The new content
goes to a temporary file in the destination's folder and is renamed over it, so the destination
must be something a rename may replace: a missing path or a regular file. A symlink is followed
(its target gets the content, the link stays), an existing file keeps its permission bits, and a
device node, FIFO, socket, folder or hard-linked file is refused, naming the path, before anything
is written.
"""
from __future__ import annotations

import os
import stat
import tempfile
from typing import BinaryIO


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def resolve_destination(path: str | os.PathLike[str]) -> tuple[str, int]:
    """The real file a write to ``path`` replaces, and the mode the new file gets.

    Raises ``OSError`` (with the path) for a destination a rename must not replace.
    """
    shown = os.fspath(path)
    real = os.path.realpath(shown)  # through symlinks: write to the target, keep the link
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real, 0o666 & ~_umask()
    kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a device node" if stat.S_ISCHR(st.st_mode)
            or stat.S_ISBLK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode) else None)
    if kind is None and not stat.S_ISREG(st.st_mode):
        kind = "not a regular file"
    if kind:
        raise OSError(f"{shown} is {kind}; vramkit writes only regular files")
    if st.st_nlink > 1:
        raise OSError(f"{shown} has {st.st_nlink} hard links; replacing it would leave the other names "
                      "with the old content (remove it or write elsewhere)")
    return real, stat.S_IMODE(st.st_mode)


class PublishOnExit:
    """A writer used with ``with``: :meth:`close` (publish) on success, :meth:`abort` on an error."""

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class AtomicFile(PublishOnExit):
    """A binary file that appears at ``path`` only on :meth:`commit` (see the module doc).

    ``with AtomicFile(p) as f: f.write(...)`` commits on success and discards on an exception.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._dest, self._mode = resolve_destination(self.path)
        folder = os.path.dirname(self._dest)
        fd, self._tmp = tempfile.mkstemp(prefix="." + os.path.basename(self._dest) + ".", suffix=".tmp",
                                         dir=folder)
        self.file: BinaryIO | None = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> int:
        if self.file is None:
            raise ValueError(f"writer for {os.path.basename(self.path)} is closed")
        return self.file.write(data)

    @property
    def closed(self) -> bool:
        return self.file is None

    def commit(self) -> None:
        """fsync, give the file its mode and rename it into place (then fsync the folder)."""
        f = self.file
        if f is None:
            return
        try:
            f.flush()
            os.fsync(f.fileno())
            f.close()
            self.file = None
            os.chmod(self._tmp, self._mode)
            os.replace(self._tmp, self._dest)
        except BaseException:
            self.abort()
            raise
        _fsync_dir(os.path.dirname(self._dest))

    def abort(self) -> None:
        """Discard everything written; the destination is left untouched."""
        f, self.file = self.file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
        try:
            os.unlink(self._tmp)
        except OSError:
            pass

    close = commit


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> str:
    """Write ``data`` to ``path`` whole or not at all (see the module doc). Returns the path."""
    with AtomicFile(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return os.fspath(path)
