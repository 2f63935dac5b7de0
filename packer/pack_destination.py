"""One pack destination on this machine, as every writer uses it: ``pack``, ``merge`` and the Ray engine.

A command that writes a pack goes through the same steps, in the same order, whoever writes it:

1. before anything is written: the name can be a pack's, the parent folder is there and writable, and
   the destination is not inside (or around) what the command reads;
2. the destination's lock, so that a second command writing the same pack is refused at once;
3. with the lock held: nothing is there, or a pack of ours that ``overwrite`` may replace;
4. the unfinished pack is written beside it, at ``DEST.partial``; what an earlier run left there is
   recognised as ours (else refused, never deleted), and kept for a resume or removed;
5. the finished pack is published by rename, replacing an old pack only once the new one is whole.

``PackDestination`` holds these steps; the rules each step applies live in ``packer.destination``. A
destination at a URL is ``packer.url_destination``'s, dispatched in ``packer.pack_url`` and ``merge``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from packload.packer.destination import (
    check_apart,
    check_destination,
    check_name,
    check_parent,
    check_partial,
    exists,
    partial_path,
    publish,
    remove_ours,
)
from packload.packer.destination_lock import DestinationLock


class PackDestination:
    """Where one command writes a pack: ``path``, its unfinished pack ``partial``, and its lock.

    Made, it has checked the name, the parent folder and that ``path`` lies apart from ``inputs``
    (``role`` names them in the message). Entered (``with``), it holds the lock and has checked what
    is at ``path`` (a pack of ours, replaced only under ``overwrite``). Use ``leftover`` and
    ``discard`` on what an earlier run left at ``partial``, then ``publish``."""

    def __init__(self, path: Path, inputs: Sequence[Path] = (), role: str = "the source folder",
                 overwrite: bool = False) -> None:
        check_name(path)
        check_parent(path)
        if inputs:
            check_apart(path, inputs, role)
        self.path = path
        self.partial = partial_path(path)
        self.overwrite = overwrite
        self._lock = DestinationLock(path)

    def __enter__(self) -> PackDestination:
        self._lock.acquire()
        try:
            check_destination(self.path, self.overwrite)
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._lock.release()

    def leftover(self, place: Path | None = None) -> bool:
        """Whether an earlier run left an unfinished pack of ours at ``partial`` (or ``place``, a
        staging folder beside it); anything else there is refused, and left alone."""
        return check_partial(self.partial if place is None else place)

    def discard(self, place: Path | None = None) -> None:
        """Remove the unfinished pack at ``partial`` (or ``place``) if one is there (recognised as
        ours by ``leftover`` first)."""
        target = self.partial if place is None else place
        if exists(target):
            remove_ours(target)

    def publish(self) -> None:
        """Put the finished pack at ``partial`` in place at ``path``, replacing an old pack there only
        now (and only if it is still a pack)."""
        publish(self.partial, self.path)
