"""Writing files below a folder without ever following a link: folders opened one component at a
time through their parent's descriptor (``O_NOFOLLOW``), files written under a temporary name and
renamed over their final name, so a link at that name is replaced, never followed, and no
half-written file ever has its final name. ``unpack`` writes every record through these."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from packload.core.errors import UsageError, WriteError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(parent_fd: int, name: str, shown: Path) -> int:
    """Folder ``name`` in ``parent_fd``, created if missing; never through a link. ``shown``: its
    path as the user knows it, for errors."""
    for _ in range(2):  # a second try if it appears between the open and the mkdir
        try:
            return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            try:
                os.mkdir(name, 0o777, dir_fd=parent_fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise WriteError(f"{shown}: could not create it ({exc.strerror}); fix permissions, or unpack "
                                 "into another folder") from None
        except OSError as exc:
            try:
                mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            except OSError:
                mode = stat.S_IFDIR
            if stat.S_ISDIR(mode):
                raise WriteError(f"{shown}: could not open it ({exc.strerror}); fix permissions, or unpack "
                                 "into another folder") from None
            what = "is a symbolic link" if stat.S_ISLNK(mode) else "exists and is not a folder"
            raise UsageError(f"{shown}: {what}, and a record needs a folder there; remove it, or unpack into "
                             "a new folder") from None
    raise UsageError(f"{shown}: changed while it was being created; unpack again")


class FolderChain:
    """The folders below one root, opened one component at a time through their parent's
    descriptor. Records come grouped by folder, so only the current chain is kept open."""

    def __init__(self, root_fd: int, shown: Path) -> None:
        self.root_fd = root_fd
        self.shown = shown
        self._chain: list[tuple[str, int]] = []  # open folders below the root, outermost first

    def enter(self, folders: tuple[str, ...]) -> int:
        """The descriptor of ``root/folders...``, creating what is missing."""
        common = 0
        while common < min(len(folders), len(self._chain)) and self._chain[common][0] == folders[common]:
            common += 1
        self._drop(common)
        for depth in range(common, len(folders)):
            parent = self._chain[-1][1] if self._chain else self.root_fd
            shown = self.shown.joinpath(*folders[: depth + 1])
            self._chain.append((folders[depth], open_dir(parent, folders[depth], shown)))
        return self._chain[-1][1] if self._chain else self.root_fd

    def _drop(self, keep: int) -> None:
        while len(self._chain) > keep:
            os.close(self._chain.pop()[1])

    def close(self) -> None:
        self._drop(0)


def write_replacing(dir_fd: int, name: str, data: memoryview, shown: Path, written: set[tuple[int, int]]) -> None:
    """Write ``data`` to ``name`` in ``dir_fd`` through a temporary name and a rename, which replaces
    a file or link there without following it. ``written``: (device, inode) of the files this unpack
    wrote; replacing one of them would lose a record, so that is an error."""
    while True:
        tmp = f".packload-{secrets.token_hex(8)}.tmp"  # short: the final name may be at the length limit
        try:
            fd = os.open(tmp, NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            st = os.fstat(f.fileno())
        try:
            old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise UsageError(f"{shown}: is a folder, and a record is a file of that name; remove it, or unpack "
                             "into a new folder")
        if old is not None and (old.st_dev, old.st_ino) in written:
            raise UsageError(f"{shown}: two records map to this one file on this file system (it does not tell "
                             "their names apart); unpack onto another file system")
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(f"{shown}: could not write it ({exc.strerror or exc}); free space or fix "
                             "permissions, or unpack into another folder") from exc
        raise
    written.add((st.st_dev, st.st_ino))
