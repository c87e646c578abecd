"""Files the user keeps (reports, hardware profiles, saved kernel libraries) get the mode a
plain ``open`` gives, not ``mkstemp``'s 0600."""

from __future__ import annotations

import os
import stat

import pytest

from graph_autofusion.codegen.compiler import write_atomic as write_bytes
from graph_autofusion.files import temp_beside, umask
from graph_autofusion.report.analysis_report import write_atomic


@pytest.fixture
def mask():
    def set_mask(m: int) -> None:
        os.umask(m)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("m", [0o022, 0o027, 0o077])
def test_written_files_take_the_umask_s_mode(tmp_path, mask, m):
    mask(m)
    assert umask() == m
    want = 0o666 & ~m
    report = write_atomic(tmp_path / "r.html", "<html></html>")
    write_bytes(tmp_path / "k.c", b"int x;\n")
    fd, tmp = temp_beside(tmp_path / "lib.so", prefix=".t-")
    os.close(fd)
    for path in (report, tmp_path / "k.c", tmp):
        assert stat.S_IMODE(os.stat(path).st_mode) == want, (path, oct(m))
    # the same mode as a file the user's own tools would write there
    with open(tmp_path / "plain", "w"):
        pass
    assert stat.S_IMODE(os.stat(tmp_path / "plain").st_mode) == want
