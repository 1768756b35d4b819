"""The results.jsonl file (its schema: lab.common.record_schema): one JSON record per run, appended
and flushed as each run ends, never rewritten.

`python -m lab.common.results --schema` prints the schema as the Markdown table the
documentation carries (docs/pages/running.md; a test keeps the two the same).
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import secrets
import sys
from pathlib import Path

from lab.common.record_schema import SCHEMA, SCHEMA_VERSION, missing_fields, schema_markdown  # noqa: F401

RESULTS_FILE = "results.jsonl"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus 4 random hex digits."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(2)}"


def new_record_id() -> str:
    return secrets.token_hex(8)


STATUSES = ("ok", "failed", "skipped")


def make_record(status: str, *, run_id: str, config: dict, np: int, nodes: int,
                started_at: str, finished_at: str | None = None, world: dict | None = None,
                figures: dict | None = None, error: dict | None = None, **rest) -> dict:
    """The one way a record is made, for every status: world.np and world.nodes always;
    an ok record the ranks' world and figures; a failed or skipped one the error (rank,
    host, reason, log tail). `rest`: epochs, step_times_s, manifest."""
    if status not in STATUSES:
        raise ValueError(f"status is one of {', '.join(STATUSES)}, not {status!r}")
    if status == "ok" and (figures is None or error is not None):
        raise ValueError("an ok record has figures and no error")
    if status != "ok" and not (error or {}).get("reason"):
        raise ValueError(f"a {status} record says why: error.reason")
    rec = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "record_id": new_record_id(),
           "status": status,
           "started_at": started_at, "finished_at": finished_at or now_iso(), "config": config,
           "world": {**(world or {}), "np": np, "nodes": nodes}}
    if figures is not None:
        rec["figures"] = figures
    if error is not None:
        rec["error"] = {"rank": None, "host": None, "log_tail": "", **error}
    rec.update(rest)
    return rec


def _upgrade(rec: dict) -> dict:
    """Records written before every status carried world.np and world.nodes kept them
    at the top level (failed and skipped records): moved where they belong now."""
    if "world" not in rec and "np" in rec:
        rec["world"] = {"np": rec.pop("np"), "nodes": rec.pop("nodes", 1)}
    return rec


def run_dir(results_dir: str | os.PathLike, run_id: str) -> Path:
    return Path(results_dir) / run_id


class FolderError(ValueError):
    """A results folder that cannot be: one sentence that says what to do."""


def check_folder(path: str | os.PathLike, what: str = "--results-dir", make: bool = True) -> None:
    """A results folder `path` (`what`: the flag that gave it), made with its parents when
    `make`; FolderError when it or a folder above it is a file (left as it is), or when it
    cannot be made or written."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                where = f"{what} {path}" if q == p else f"{what} {path}: {q}"
                raise FolderError(f"{where} is a file, not a folder: give a folder (it is made "
                                  f"when missing); the file is left as it is")
            break
    if not make:
        return
    try:
        os.makedirs(p, exist_ok=True)
        if not os.access(p, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as e:
        raise FolderError(f"{what} {path} cannot be used ({e.strerror or e}): give a folder "
                          f"that can be created and written") from None


def _open_locked(path: Path, flags: int, mode: int = 0o644) -> int:
    """`path` opened and flock'ed (exclusive) for one write or one rewrite: appenders and
    update_records, whose rename puts a new file in its place, never lose each other's
    records (an appender that waited on the file renamed away opens the new one)."""
    while True:
        fd = os.open(path, flags, mode)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def append_record(path: str | os.PathLike, record: dict) -> None:
    """Append one record as a line and push it to disk before returning."""
    record = {"schema_version": SCHEMA_VERSION, **record}
    line = json.dumps(record, sort_keys=False, separators=(",", ":")) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write of the whole line on an O_APPEND descriptor, under the file's lock:
    # concurrent writers never interleave within a line, nor lose one to a rewrite.
    made = not path.exists()
    fd = _open_locked(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        if made:
            # bench (recording a failed launch, say) made it in a folder handed to the ranks'
            # user (lab.host.places.image.hand_over): theirs, or open to all as the folder
            # is, so that they append later
            folder = path.parent.stat()
            if os.getuid() == 0:
                os.fchown(fd, folder.st_uid, folder.st_gid)
            elif folder.st_mode & 0o002:
                os.fchmod(fd, 0o666)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line  # a torn last line (a crash mid-write) stays on its own
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


DROP = object()     # what an update returns to take a record out (lab.host.run.restart)


def update_records(path: str | os.PathLike, start: int, update) -> int:
    """Apply `update(record) -> record, None (unchanged) or DROP (taken out)` to the
    records from index `start` on and write the file anew (a temporary file renamed over
    it: a crash leaves the old file or the new one, never half of one). For bench, once a job's ranks are gone, to add what
    only the launcher knows (a scheduler's final state). Lines that do not parse are kept
    as they were. Returns how many records changed."""
    path = Path(path)
    # no record appended meanwhile is lost by the rename (flock takes a file opened for
    # reading: flock(2), "regardless of the mode in which the file was opened")
    fd = _open_locked(path, os.O_RDONLY)
    try:
        return _rewrite(path, start, update)
    finally:
        os.close(fd)


def _rewrite(path: Path, start: int, update) -> int:
    lines = path.read_text().splitlines(keepends=True)
    changed, index, out = 0, 0, []
    for line in lines:
        try:
            rec = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and "schema_version" in rec and rec["schema_version"] <= SCHEMA_VERSION:
            if index >= start:
                new = update(rec)
                if new is DROP:
                    changed += 1
                    index += 1
                    continue
                if new is not None:
                    line = json.dumps(new, sort_keys=False, separators=(",", ":")) + "\n"
                    changed += 1
            index += 1
        out.append(line if line.endswith("\n") else line + "\n")
    if changed:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write("".join(out))
            f.flush()
            os.fsync(f.fileno())
        st = path.stat()
        mode = st.st_mode & 0o777
        if os.getuid() == 0:    # the ranks (another user) append to it later
            os.chown(tmp, st.st_uid, st.st_gid)
        elif st.st_uid != os.getuid():
            mode |= 0o666       # we cannot give it back: let its owner append still
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    return changed


def read_records(path: str | os.PathLike) -> tuple[list[dict], list[str]]:
    """All records of a results file, and one message per line that could not be read
    (a line cut short by a crash is reported, not fatal)."""
    records, problems = [], []
    path = Path(path)
    if not path.exists():
        return records, problems
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"{path}:{n}: not a JSON record ({e.msg}); line skipped")
                continue
            if not isinstance(rec, dict) or "schema_version" not in rec:
                problems.append(f"{path}:{n}: not a results record; line skipped")
                continue
            if rec["schema_version"] > SCHEMA_VERSION:
                problems.append(f"{path}:{n}: schema version {rec['schema_version']} is newer "
                                f"than this kit's {SCHEMA_VERSION}; upgrade the kit to read it")
                continue
            records.append(_upgrade(rec))
    return records, problems


if __name__ == "__main__":
    if sys.argv[1:] == ["--schema"]:
        sys.stdout.write(schema_markdown())
    else:
        sys.exit("usage: python -m lab.common.results --schema")
