"""Temporary files beside a destination, for writes that replace it atomically.

``tempfile.mkstemp`` creates its file with mode 0600 whatever the process's umask; renamed
onto the destination, a report, a hardware profile or a saved kernel library would be
readable by its owner alone, unlike every file the user's own tools write (0666 less the
umask, as ``open`` gives). :func:`temp_beside` gives the temporary file that mode;
:func:`copy_beside` copies a built file (a kernel library) into place through one.
"""

from __future__ import annotations

import os
import shutil
import tempfile


def umask() -> int:
    """The process's umask, read without changing it where Linux reports it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (other threads may see 022 briefly)
    os.umask(mask)
    return mask


def temp_beside(dest: str | os.PathLike[str], prefix: str, suffix: str = "") -> tuple[int, str]:
    """``(fd, path)`` of a new temporary file in ``dest``'s folder with the mode a plain
    ``open`` would give it (0666 less the umask)."""
    folder = os.path.dirname(os.fspath(dest)) or "."
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~umask())
    except OSError:  # a file system without modes: the file is still ours to write
        pass
    return fd, path


def copy_beside(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Copy ``src``'s contents to ``dest`` through a temporary file beside it (a reader sees
    the old file or the whole new one), with :func:`temp_beside`'s mode, not ``src``'s."""
    fd, tmp = temp_beside(dest, prefix=".gaf-")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)  # the contents only: the mode stays temp_beside's
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
