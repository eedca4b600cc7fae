"""Write result files atomically: a reader (or an interrupted run) never sees half a file; and make a
shared folder one process's at a time (`held`)."""
from __future__ import annotations

import contextlib
import csv
import fcntl
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    # Read, not set: os.umask() can only be queried by changing it, which races with other threads.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def write_text_atomic(path: Path, text: str | bytes) -> None:
    """Text, or bytes (an ONNX file), into `path` through a temporary file beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # mkstemp makes 0600 files; a result or lock file gets the mode any new file would. (A lock
        # file's mode is part of the Docker layer cache key: 0600 here vs 0644 in a clone rebuilt all.)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_csv_atomic(path: Path, rows: list[dict], columns: list[str]) -> None:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: ("" if row.get(c) is None else row.get(c)) for c in columns})
    write_text_atomic(path, buffer.getvalue())


def upsert_csv(path: Path, new_rows: list[dict], columns: list[str], key: list[str]) -> list[dict]:
    """Replace rows with the same key, keep the others, write atomically; returns all rows."""
    def key_of(row):  # as written to CSV: None is an empty cell
        return tuple("" if row.get(k) is None else str(row.get(k)) for k in key)

    fresh = {key_of(r) for r in new_rows}
    kept = [r for r in read_csv(path) if key_of(r) not in fresh]
    rows = kept + new_rows
    write_csv_atomic(path, rows, columns)
    return rows


def shown(path: Path) -> str:
    """A path as messages show it: relative to the repository when inside it."""
    repo = Path(__file__).resolve().parent.parent
    return str(path.relative_to(repo)) if Path(path).is_relative_to(repo) else str(path)


@contextlib.contextmanager
def held(lock: Path, *, what: str, log=print):
    """The block runs while this process alone holds `lock` (an flock, released even when killed):
    folders that several processes fill on first use (toolkits, wheelhouses, build contexts) are made
    by one while the others wait, then find them made. Another holder is said once, with `what`."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting: another process is {what} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
