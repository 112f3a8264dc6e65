"""Paths in the spec: what a run reads, writes and mounts (pure).

Paths reach argv, sbatch lines, mounts and the run directory: an option in disguise, an unexpanded `~`, a climb out
with `..` or a system directory are refused where the spec is validated, and `write_path_problem` holds paths given
elsewhere (`--run-dir`) to the same rules.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated

from pydantic import AfterValidator, Field

SAFE_PATH = r"^[A-Za-z0-9_./~+-][A-Za-z0-9_./+@=,-]*$"
BIND = r"^[A-Za-z0-9_./~+-][A-Za-z0-9_./+@=,-]*(:[A-Za-z0-9_./+@=,-]+){0,2}$"

#: Pseudo-filesystems: reading them yields the process environment, kernel state or devices, never run data.
PSEUDO_DIRS = ("/proc", "/sys", "/dev")
#: The system's own directories: nothing of a run is written or mounted there.
SYSTEM_DIRS = (*PSEUDO_DIRS, "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr", "/run", "/var/run")
#: The trainer image's writable directories besides /tmp and /runs (Dockerfile: HOME, the caches under /scratch);
#: the trainer pod mounts an emptyDir on each, its root filesystem being read-only (longhaul.render.kubernetes).
TRAINER_HOME = "/home/longhaul"
TRAINER_SCRATCH = "/scratch"
#: Directories the trainer pod mounts itself: a checkpoint volume cannot go there.
POD_OWN_MOUNTS = ("/tmp", TRAINER_HOME, TRAINER_SCRATCH)


def _path_problem(value: str, *, write: bool) -> str | None:
    """Why a path from the spec is refused (None: fine). Paths reach argv, sbatch lines, mounts and the run
    directory: an option in disguise, an unexpanded `~`, a climb out with `..` or a system directory are refused."""
    if value.startswith("-"):
        return f"starts with '-', which a command would read as an option; write ./{value} for a relative path"
    if value.startswith("~"):
        return "'~' is not expanded (paths are passed quoted, never through a shell); write the full path"
    if any(len(part.encode()) > 255 for part in value.split("/")):
        return "has a path component longer than 255 bytes, which no filesystem stores"
    if ".." in value.split("/"):
        return (
            "'..' is not allowed: name the directory itself (a path in a spec must not climb out of the "
            "submit, working or run directory)"
        )
    if value.startswith("/"):
        norm = posixpath.normpath(re.sub("/+", "/", value))
        if write and norm == "/":
            return "is the root directory; name a directory of its own"
        for d in SYSTEM_DIRS if write else PSEUDO_DIRS:
            if norm == d or norm.startswith(d + "/"):
                why = (
                    "nothing of a run is written or mounted there"
                    if write
                    else "it holds the process environment, kernel state and devices, not data"
                )
                return f"is inside {d}, a system directory: {why}"
    return None


def write_path_problem(value: str) -> str | None:
    """Why `value` cannot be a directory a run writes into (None: it can) — the rules of the spec's `output_dir`
    fields, for paths given elsewhere (`--run-dir`): its characters, its length and `_path_problem`."""
    if len(value) > 1024:
        return "is longer than 1024 characters"
    if not re.fullmatch(SAFE_PATH, value):
        return (
            "contains characters or a form that is not allowed: letters, digits and _ . / ~ + - @ = , only (no "
            "spaces, quotes, '$' or control characters), not starting with '@', '=' or ','"
        )
    return _path_problem(value, write=True)


def check_read_path(value: str) -> str:
    """A validator: `value` is a path a run may read (`_path_problem`)."""
    problem = _path_problem(value, write=False)
    if problem:
        raise ValueError(problem)
    return value


def _write_path(value: str) -> str:
    problem = _path_problem(value, write=True)
    if problem:
        raise ValueError(problem)
    return value


def _mount_path(value: str) -> str:
    _write_path(value)
    if not value.startswith("/"):
        raise ValueError("a mount path inside the pod must be absolute (start with /)")
    norm = posixpath.normpath(re.sub("/+", "/", value))
    for d in POD_OWN_MOUNTS:
        if norm == d or norm.startswith(d + "/") or d.startswith(norm + "/"):
            raise ValueError(f"collides with {d}, which the trainer pod mounts itself; use e.g. /checkpoints")
    return value


def _bind(value: str) -> str:
    """SRC[:DST[:OPTS]] of apptainer -B / pyxis --container-mounts."""
    if "," in value:
        raise ValueError(
            "',' separates mounts in apptainer -B and pyxis --container-mounts: give each mount its own entry"
        )
    src, *rest = value.split(":")
    for part, what in ((src, "source"), *([(rest[0], "destination")] if rest else [])):
        problem = (
            _path_problem(part, write=False)
            if what == "destination" or part != "/"
            else "is the host's root directory; bind the directories the job needs"
        )
        if what == "source" and problem and problem.startswith("is inside"):
            problem = None  # host devices and system files are bound on purpose (/dev/infiniband, /etc/slurm)
        if problem:
            raise ValueError(f"bind {what} {part!r} {problem}")
    if rest and (not rest[0].startswith("/") or posixpath.normpath(rest[0]) == "/"):
        raise ValueError(f"bind destination {rest[0]!r} must be an absolute directory inside the container, not /")
    return value


#: A path that is read (models, datasets, images, virtualenvs).
SafePath = Annotated[str, Field(pattern=SAFE_PATH, max_length=1024), AfterValidator(check_read_path)]
#: A directory that is written (run outputs).
WritePath = Annotated[str, Field(pattern=SAFE_PATH, max_length=1024), AfterValidator(_write_path)]
#: One word of a command line (options allowed).
ArgvWord = Annotated[str, Field(pattern=SAFE_PATH, max_length=1024)]
#: A mount path inside the trainer pod (absolute, clear of the directories the pod mounts itself).
MountPath = Annotated[str, Field(pattern=SAFE_PATH, max_length=1024), AfterValidator(_mount_path)]
#: One bind mount of apptainer -B / pyxis --container-mounts: SRC[:DST[:OPTS]].
BindMount = Annotated[str, Field(pattern=BIND, max_length=2048), AfterValidator(_bind)]
