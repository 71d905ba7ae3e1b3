"""`doctor --png DIR`, checked before any work starts, torch-free: a folder the figures can be written to (made where
its parent exists), not a file, not a file `--json` or `--html` will write, and not inside anything the command reads."""

from __future__ import annotations

import os

from .checks import covers


def png_folder_problem(folder: str, reads: list[str], outputs: dict[str, str | None] | None = None) -> str | None:
    """Why the figures cannot go to `folder`, in one line; None where they can. `outputs`: the command's other
    outputs by flag (`--json`, `--html`), which the folder may not be, nor lie inside."""
    for flag, path in (outputs or {}).items():
        if path and covers(path, folder):
            return f"--png {folder}: the file {flag} writes ({path}); give the figures a folder of their own"
    if folder == "" or (os.path.lexists(folder) and not os.path.isdir(folder)):  # a file, a device, a dangling link
        return f"--png {folder or repr(folder)}: not a folder (the figures are written as DIR/<rank>-<finding>-*.png)"
    parent = folder if os.path.isdir(folder) else os.path.dirname(os.path.abspath(folder))
    if not (os.path.isdir(parent) and os.access(parent, os.W_OK)):
        return f"--png {folder}: not a writable folder (it, or its parent, must exist and be writable)"
    for read in reads:
        if covers(read, folder):
            return f"--png {folder}: inside {read}, which this command reads; write the figures elsewhere"
    return None


def check_png_folder(
    parser, folder: str | None, reads: list[str], outputs: dict[str, str | None] | None = None
) -> None:
    """`--png DIR`, where given, refused in one line before any work starts (`png_folder_problem`)."""
    problem = folder is not None and png_folder_problem(folder, reads, outputs)
    if problem:
        parser.error(problem)
