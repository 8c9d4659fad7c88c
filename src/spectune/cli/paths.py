"""Checks of the files, folders and programs a command line names, made before any work.

Each check returns the path or raises ``InvalidParameterError`` with one line naming the
flag, so that a typo costs a second instead of a run whose results cannot be written:

- ``output_file`` / ``output_folder``: the output can be written where it is asked for (not
  a folder where a file goes or a file where a folder goes; the folder it lands in exists,
  or can be made, and takes new files: probed by creating an unnamed file, which also
  catches read-only file systems and a superuser's ``os.access`` that says yes to all);
  and it is none of the command's inputs (``Named`` pairs), compared as files on disk, nor
  a file already in an input folder, so that ``--out`` cannot replace the trace, corpus or
  model the command reads.
- ``distinct_outputs``: two outputs of one command are not the same file.
- ``executable``: a program that exists, is a file and may be run.

``write_text`` writes a checked output, a failure still one line.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from spectune.errors import InvalidParameterError

__all__ = [
    "Named",
    "distinct_outputs",
    "executable",
    "output_file",
    "output_folder",
    "write_text",
]

Named = tuple[str, str | Path | None]  # (flag, path); a None path is skipped


def output_file(
    path: str | Path, flag: str, inputs: Iterable[Named] = (), *, make_parents: bool = False
) -> Path:
    """``path`` as a file the command may write: not a folder, not an input, in a folder
    that exists (or, with ``make_parents``, that the command can create) and takes files."""
    out = Path(path)
    if out.is_dir():
        raise InvalidParameterError(f"{flag} {out} is a folder; give a file name")
    _not_an_input(out, flag, inputs)
    folder = out.parent
    if not make_parents and not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise InvalidParameterError(f"{flag} {out}: its folder {folder} {what}")
    _takes_files(folder, flag, out)
    if out.exists() and not os.access(out, os.W_OK):
        raise InvalidParameterError(f"{flag} {out}: the file is not writable")
    return out


def output_folder(path: str | Path, flag: str, inputs: Iterable[Named] = ()) -> Path:
    """``path`` as a folder the command may create (with its parents) and fill."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InvalidParameterError(f"{flag} {out} is a file; give a folder")
    _not_an_input(out, flag, inputs)
    _takes_files(out, flag, out)
    return out


def distinct_outputs(outputs: Iterable[Named]) -> None:
    """Two outputs of one command that name the same file: the second would replace the
    first."""
    seen: list[tuple[str, Path]] = []
    for flag, path in outputs:
        if path is None:
            continue
        for other_flag, other in seen:
            if _same(Path(path), other):
                raise InvalidParameterError(
                    f"{flag} {path} is also the {other_flag} file; give each output its own name"
                )
        seen.append((flag, Path(path)))


def executable(path: str | Path, flag: str) -> Path:
    """``path`` as a program to start: an existing file with execute permission."""
    program = Path(path)
    if not program.exists():
        raise InvalidParameterError(f"{flag} {program}: no such file")
    if program.is_dir():
        raise InvalidParameterError(f"{flag} {program} is a folder, not a program")
    if not os.access(program, os.X_OK):
        raise InvalidParameterError(
            f"{flag} {program} is not executable (chmod +x it, or give the program itself)"
        )
    return program


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same inode where both exist (links and
    relative spellings included), else the same absolute path."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _not_an_input(out: Path, flag: str, inputs: Iterable[Named]) -> None:
    """``out`` is no input, nor a file already in an input folder (a model's config)."""
    for input_flag, source in inputs:
        # Only an input that exists can be destroyed; one that does not fails on its own.
        if source is None or not Path(source).exists():
            continue
        if _same(out, Path(source)):
            raise InvalidParameterError(
                f"{flag} {out} is the {input_flag} input; writing it would destroy it "
                "(give another output name)"
            )
        if (
            Path(source).is_dir()
            and out.is_file()
            and out.resolve().is_relative_to(Path(source).resolve())
        ):
            raise InvalidParameterError(
                f"{flag} {out} is a file of the {input_flag} folder; writing it would "
                "replace it (give another output name)"
            )


def _takes_files(folder: Path, flag: str, out: Path) -> None:
    """``folder``, or the nearest of its parents that exists (the rest are created),
    is a folder in which a file can be created."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InvalidParameterError(f"{flag} {out}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InvalidParameterError(f"{flag} {out}: cannot write in {existing} ({reason})") from exc


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` (UTF-8); an OS error is a one-line ``InvalidParameterError``."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidParameterError(f"cannot write {path}: {exc.strerror}") from exc
