"""The command line's argument parser and argument checks: every user mistake is one line.

:class:`Parser` is ``argparse.ArgumentParser`` whose errors print ``graph-autofusion: error:
...`` on one line (the command, the problem, the accepted values; no usage block) and exit with
status 2, like every other error of the CLI. The type functions check numeric options while the
arguments are parsed, before any long work starts. :func:`one_line` turns an exception into the
message the CLI prints; :func:`check_input_file` and :func:`check_output_path` check paths up
front.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import NoReturn

from graph_autofusion.errors import PathError

__all__ = [
    "Parser",
    "check_input_file",
    "check_output_path",
    "cosine_floor",
    "fraction",
    "non_negative_int",
    "one_line",
    "positive_int",
    "print_error",
]

PROG = "graph-autofusion"


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error form: one line on stderr naming the command, status 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]
        where = f"{command}: " if command else ""
        self.exit(2, f"{PROG}: error: {where}{message} (see `{self.prog} --help`)\n")


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (runs, threads, sequence length, cluster limits)."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1) (the benefit threshold: the minimum relative saving)."""
    value = float(_number(text, float))
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def cosine_floor(text: str) -> float:
    """A cosine similarity floor in [-1, 1]."""
    value = float(_number(text, float))
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a cosine in [-1, 1], got {text!r}")
    return value


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line; an ``OSError`` as ``PATH: reason``."""
    if isinstance(exc, OSError) and exc.strerror:
        names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
        text = f"{' -> '.join(names)}: {exc.strerror}" if names else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def print_error(exc: BaseException) -> int:
    """Print ``exc`` as the CLI's one error line; return the exit status 2."""
    print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
    return 2


def check_input_file(path: str, what: str = "file") -> None:
    """Raise :class:`PathError` naming ``path`` when it is missing, a directory or unreadable."""
    if not os.path.exists(path):
        raise PathError(f"{path}: {what} not found")
    if os.path.isdir(path):
        raise PathError(f"{path}: {what} is a directory, not a file")
    if not os.path.isfile(path):
        raise PathError(f"{path}: {what} is not a regular file")
    if not os.access(path, os.R_OK):
        raise PathError(f"{path}: {what} is not readable (permission denied)")


def check_output_path(path: str, what: str = "output", *, make_folder: bool = False) -> None:
    """Raise :class:`PathError` naming ``path`` when it cannot be written: a directory, a
    device or other non-regular file, a folder that is missing (unless ``make_folder``: the
    writer creates it, then its nearest existing parent must be a writable folder) or
    read-only."""
    if os.path.isdir(path):
        raise PathError(f"{path}: cannot write there: the {what} is a directory, not a file path")
    if os.path.exists(path) and not os.path.isfile(path):
        raise PathError(f"{path}: cannot write there: it exists and is not a regular file")
    folder = os.path.dirname(os.path.abspath(path))
    if make_folder:
        while not os.path.exists(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        missing = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise PathError(f"{path}: cannot write there: {folder} {missing}")
    if not os.access(folder, os.W_OK):
        raise PathError(f"{path}: cannot write there: folder {folder} is read-only")
