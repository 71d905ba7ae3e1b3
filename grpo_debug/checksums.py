"""A folder's SHA-256 manifest: what a writer (a capture, a training checkpoint) records of every file it wrote,
and what a reader verifies before it trusts any of them.

    write_checksums(folder)           # folder/checksums.json: {relative path: sha256}, every file but itself
    problem = checksum_problem(folder)  # None, or one sentence naming the file that does not match

A file the manifest does not list is a problem too (an added config or weights file changes what is built).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .files import read_bounded, write_text_atomically

MANIFEST = "checksums.json"
MAX_MANIFEST_BYTES = 16 * 2**20  # a manifest lists a capture's files: far below this
CHUNK = 1 << 20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_checksums(folder: str | Path) -> Path:
    """Record the SHA-256 of every file under `folder` (written last, atomically)."""
    folder = Path(folder)
    manifest = {name: sha256(folder / name) for name in _files(folder)}
    write_text_atomically(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return folder / MANIFEST


def checksum_problem(folder: str | Path, hash_up_to: int | None = None) -> str | None:
    """None when every file under `folder` is listed in its manifest with its SHA-256; else what is wrong,
    naming the file (a missing manifest included). `hash_up_to`: files larger than this many bytes are only
    checked to be there (what a page listing captures can afford; a reader of the capture hashes them all)."""
    folder = Path(folder)
    listed = folder / MANIFEST
    if not listed.is_file():
        return f"{listed} is missing: nothing records what was written, so nothing here can be trusted"
    try:
        manifest = json.loads(read_bounded(listed, MAX_MANIFEST_BYTES))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError, and so is a file past its bound
        return f"{listed} is not valid JSON ({e})" if isinstance(e, json.JSONDecodeError) else str(e)
    if not isinstance(manifest, dict) or not all(isinstance(v, str) for v in manifest.values()):
        return f"{listed} is not a {{file: sha256}} object"
    for name, digest in manifest.items():
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{listed} lists {name!r}, a path outside {folder}"
        if not path.is_file():
            return f"{path} is missing (listed in {MANIFEST})"
        if (hash_up_to is None or path.stat().st_size <= hash_up_to) and sha256(path) != digest:
            return f"{path} does not match its checksum in {MANIFEST}: it changed after it was written"
    extra = [name for name in _files(folder) if name not in manifest]
    if extra:
        return f"{folder / extra[0]} was not written with the rest ({len(extra)} file(s) not in {MANIFEST})"
    return None
