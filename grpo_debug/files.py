"""Files: where the bundled data and model live, and writing a file so that a reader only ever sees the old
version or the whole new one. GRPO_DEBUG_MODEL overrides the default model (a folder or hub id)."""

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
DEFAULT_MODEL_DIR = DATA_DIR / "models" / "rookworld-tiny"
DEFAULT_MODEL = os.environ.get("GRPO_DEBUG_MODEL", str(DEFAULT_MODEL_DIR))
HUB_MODEL = "jrahn/RookWorld-LM-124M"
MAX_READ_BYTES = 256 * 2**20  # a JSON file or log of this package's past this size was not written by it


def write_atomically(path: str | os.PathLike, write: Callable[[IO], None], binary: bool = False) -> None:
    """`write(f)` into a new temporary file beside `path` (a hidden name of its own: no file of the user's is written
    through or replaced but `path`), fsync it, then rename it over `path`. If anything
    fails (a full disk, a kill is another story: the rename never happened) the temporary file is removed,
    `path` keeps its old content, and OSError names `path` and the reason. A `path` that is a character device or
    a pipe (/dev/stdout, /dev/full) is written in place, flushed and closed (a rename would replace the device
    with a file): a write it refuses is the same OSError; a block device is refused."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        return _write_in_place(path, write, binary)
    # a name of its own, made new (never a user's file of that name, never through a symlink), hidden beside `path`
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OSError(e.errno, f"could not write {path}: {e.strerror or e}") from None
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as a file made by open(): mkstemp's are 0600
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"could not write {path}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread a moment)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _write_in_place(path: Path, write: Callable[[IO], None], binary: bool) -> None:
    """A character device or a pipe written through: every byte flushed (fsync where the device takes one), closed;
    OSError naming `path` where any of it fails."""
    mode = path.stat().st_mode
    try:
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise OSError(errno.EINVAL, "not a file, a character device or a pipe")
        with path.open("wb" if binary else "w") as f:
            write(f)
            f.flush()
            try:
                os.fsync(f.fileno())
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):  # a device or pipe with nothing to sync
                    raise
    except OSError as e:
        raise OSError(e.errno, f"could not write {path}: {e.strerror or e}") from None


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    write_atomically(path, lambda f: f.write(text))


def read_bounded(path: str | os.PathLike, limit: int) -> str:
    """The text of `path`, its size checked before a byte is read: ValueError naming the file past `limit` bytes
    (a file this large was not written by this package, and reading it whole could exhaust the memory)."""
    size = os.stat(path).st_size
    if size > limit:
        raise ValueError(f"{path} is {_size(size)}: over the {_size(limit)} this reads")
    return Path(path).read_text()


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MB" if n >= 2**20 else f"{n} bytes"
