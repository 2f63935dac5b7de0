"""Where the block cache lives: packload's own folder inside the cache folder given, and its pack folders.

The cache lives in a folder of its own, ``packload-blocks``, inside the cache folder the user gives
(``cache_dir``; default ``$PACKLOAD_CACHE``, else ``$XDG_CACHE_HOME/packload``, else
``~/.cache/packload``). That folder may be shared with other programs and hold the user's files:
packload never lists, evicts, opens or writes anything in it but its own subfolder. The subfolder
holds a ``CACHEDIR.TAG`` marker that names it as packload's block cache; a ``packload-blocks``
that exists without the marker and holds anything is not used (its files are someone else's). A
``cache_dir`` that is a symbolic link is resolved once, when the cache is opened, and the folder it
names is used (a cache folder linked to a larger disk is common); nothing below it is ever
followed: every folder and file of the cache is opened relative to its folder's descriptor with
``O_NOFOLLOW``, so a link planted there is neither read through nor written through.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import threading
from pathlib import Path

from packload.core.storage import unwritable_reason

CACHE_SUBFOLDER = "packload-blocks"  # packload's own folder inside the cache folder given
MARKER_NAME = "CACHEDIR.TAG"
# The cache directory tag (bford.ch/cachedir): backup tools skip the folder; our second line says whose it is.
MARKER = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
          b"# packload's block cache: packload deletes only the entries it recorded here.\n")
PACK_FOLDER = re.compile(r"(pack|lmdb)-[0-9a-f]{32}")
# How every file and folder of the cache is opened: never through a link, never into a child process.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO in the cache is opened without waiting for a writer
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | CLOEXEC


def default_cache_dir() -> Path:
    """``$PACKLOAD_CACHE``, else ``$XDG_CACHE_HOME/packload``, else ``~/.cache/packload`` (packload's
    files go into its ``packload-blocks`` subfolder)."""
    if os.environ.get("PACKLOAD_CACHE"):
        return Path(os.environ["PACKLOAD_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packload"


def pack_folder_name(kind: str, identity: str) -> str:
    """The folder of one pack's entries: ``pack-<hash>`` (a shards pack, by its manifest) or
    ``lmdb-<hash>`` (an LMDB object, by its URL and version)."""
    if kind not in ("pack", "lmdb"):
        raise ValueError(f"kind {kind!r}: pack or lmdb")
    return f"{kind}-{hashlib.sha256(identity.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"


class CacheUnusableError(OSError):
    """The cache folder cannot be used; the message says why."""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


class CacheFolder:
    """``root/packload-blocks`` (``path``), opened (created and marked when missing) on first use,
    and the descriptors of its pack folders, kept open until ``close``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = Path(os.path.realpath(root)) / CACHE_SUBFOLDER  # a link given is followed here, once
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._packs: dict[str, int] = {}

    def problem(self) -> str | None:
        """Why the cache folder cannot be used (None when it can): it is created if missing."""
        try:
            self.fd()
        except CacheUnusableError as exc:
            return str(exc)
        return None

    def fd(self) -> int:
        """The descriptor of ``packload-blocks``, created with its marker when missing;
        ``CacheUnusableError`` saying why when it cannot be used."""
        with self._lock:
            if self._fd is None:
                self._fd = self._open()
            return self._fd

    def pack_fd(self, pack: str, create: bool) -> int | None:
        """The descriptor of the pack folder ``pack`` (made when ``create``); None when it is not
        there, or is not a folder of ours (a link, a file)."""
        if not PACK_FOLDER.fullmatch(pack):
            raise ValueError(f"{pack!r}: not a cache folder's name (pack_folder_name gives them)")
        with self._lock:
            found = self._packs.get(pack)
        if found is not None:
            return found
        try:
            root = self.fd()
        except CacheUnusableError:
            return None
        if create:
            try:
                os.mkdir(pack, 0o755, dir_fd=root)
            except FileExistsError:
                pass
            except OSError:
                return None
        try:
            fd = os.open(pack, _DIR_FLAGS, dir_fd=root)
        except OSError:
            return None
        with self._lock:
            if pack in self._packs:  # another thread opened it meanwhile
                os.close(fd)
                return self._packs[pack]
            self._packs[pack] = fd
        return fd

    def pack_folders(self) -> list[tuple[str, int]]:
        """(name, descriptor) of every pack folder of the cache (real folders of the names it gives)."""
        try:
            root = self.fd()
        except CacheUnusableError:
            return []
        with os.scandir(root) as packs:
            names = [e.name for e in packs if PACK_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        found = []
        for pack in names:
            folder = self.pack_fd(pack, create=False)
            if folder is not None:
                found.append((pack, folder))
        return found

    def close(self) -> None:
        """Let go of the folders' descriptors (they are opened again if used)."""
        with self._lock:
            fds = [*self._packs.values(), *([self._fd] if self._fd is not None else [])]
            self._packs, self._fd = {}, None
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    # -- opening ------------------------------------------------------------------------------
    def _open(self) -> int:
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheUnusableError(self._unusable(parent, exc)) from None
        if not parent.is_dir():
            raise CacheUnusableError(f"{self.root} is not a folder")
        try:
            parent_fd = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | CLOEXEC)
        except OSError as exc:
            raise CacheUnusableError(self._unusable(parent, exc)) from None
        try:
            try:
                os.mkdir(CACHE_SUBFOLDER, 0o755, dir_fd=parent_fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise CacheUnusableError(self._unusable(parent, exc)) from None
            try:
                fd = os.open(CACHE_SUBFOLDER, _DIR_FLAGS, dir_fd=parent_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise CacheUnusableError(f"{self.path} is a symbolic link or a file, not packload's cache "
                                             "folder; move it away, or give another cache_dir") from None
                raise CacheUnusableError(self._unusable(self.path, exc)) from None
        finally:
            os.close(parent_fd)
        try:
            self._check_marker(fd)
            if not os.access(self.path, os.W_OK | os.X_OK):
                raise CacheUnusableError(f"{self.path} cannot be written (permission denied)")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _unusable(self, place: Path, exc: OSError) -> str:
        why = unwritable_reason(place)
        if why:
            return f"{place} cannot be written: {why}"
        if exc.errno == errno.ENOSPC:
            return f"{place} cannot be written: its disk is full"
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            return f"{place} is not a folder (a file is in the way)"
        return f"{place} cannot be used ({_reason(exc)})"

    def _unreadable_marker(self, exc: OSError) -> CacheUnusableError:
        return CacheUnusableError(f"{self.path}/{MARKER_NAME} cannot be read ({_reason(exc)}): not packload's "
                                  "cache folder; give another cache_dir")

    def _check_marker(self, fd: int) -> None:
        """The folder must be packload's: its marker there, or nothing at all there (then marked now)."""
        try:
            # Never blocks: a FIFO planted here is read as empty (not the marker), never waited on.
            marker = os.open(MARKER_NAME, os.O_RDONLY | NONBLOCK | NOFOLLOW | CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            if os.listdir(fd):
                raise CacheUnusableError(f"{self.path} holds files that are not packload's (no {MARKER_NAME} of "
                                         "packload's there), so packload leaves it alone; give another cache_dir, "
                                         "or move that folder away") from None
            try:
                marker = os.open(MARKER_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o644,
                                 dir_fd=fd)
                try:
                    os.write(marker, MARKER)
                finally:
                    os.close(marker)
            except FileExistsError:
                pass  # another process marked it meanwhile
            except OSError as exc:
                raise CacheUnusableError(self._unusable(self.path, exc)) from None
            return
        except OSError as exc:
            raise self._unreadable_marker(exc) from None
        try:
            text = os.read(marker, len(MARKER) + 1)
        except OSError as exc:  # a folder, or a FIFO with a writer: not our marker, and said so
            raise self._unreadable_marker(exc) from None
        finally:
            os.close(marker)
        if text != MARKER:
            raise CacheUnusableError(f"{self.path}/{MARKER_NAME} is not packload's marker, so packload leaves the "
                                     "folder alone; give another cache_dir")
