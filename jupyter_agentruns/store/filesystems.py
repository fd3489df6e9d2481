"""Whether a file lies on a network file system, where the SQLite store is unsafe.

The SQLite store runs in WAL mode: its connections share an index through
memory mapped from a ``-shm`` file, and coordinate through file locks. Neither
works across the network (NFS, SMB and the like; a FUSE file system promises
no more): a connection can miss another's commits and the database can be
corrupted. JupyterHub homes are often on NFS, so the server looks before it
opens the file.

The mount table is Linux's ``/proc/self/mountinfo``; where there is none,
nothing is known and nothing is refused.
"""

from __future__ import annotations

import os
import re
from pathlib import PurePosixPath

MOUNTINFO = "/proc/self/mountinfo"

NETWORK_TYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs",
        "lustre", "gpfs", "beegfs", "ocfs2", "gfs2", "davfs", "sshfs",
    }
)  # fmt: skip

# A mount point escapes the characters that would break its line: space, tab, newline, backslash.
_ESCAPE = re.compile(r"\\([0-7]{3})")


def network_filesystem(path: str | os.PathLike[str]) -> str | None:
    """The type of the network or FUSE file system ``path`` is on (``"nfs4"``), or None."""
    try:
        with open(MOUNTINFO, "rb") as table:
            mounts = _mounts(os.fsdecode(table.read()))
    except OSError:
        return None
    # Symlinks resolved as far as the path exists; the rest (the file not created
    # yet) cannot be a mount point, so its nearest existing directory decides.
    where = PurePosixPath(os.path.realpath(path))
    fstype = None
    depth = -1
    for mount_point, mount_type in mounts:
        # Component-wise (/home2 is not under /home); a later mount on the same point hides the earlier.
        if where.is_relative_to(mount_point) and len(mount_point.parts) >= depth:
            fstype, depth = mount_type, len(mount_point.parts)
    return fstype if fstype is not None and _is_network(fstype) else None


def _mounts(table: str) -> list[tuple[PurePosixPath, str]]:
    """``(mount point, type)`` of each mount, in mount order.

    A line is ``id parent major:minor root mount-point options [optional...] - type source ...``.
    """
    mounts = []
    for line in table.splitlines():
        fields = line.split(" ")
        try:
            end = fields.index("-", 6)
            mount_point = _ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields[4])
            mounts.append((PurePosixPath(mount_point), fields[end + 1]))
        except (ValueError, IndexError):
            continue
    return mounts


def _is_network(fstype: str) -> bool:
    # fuseblk is a FUSE driver of a local disk (NTFS, exFAT); fusectl is FUSE's control file system.
    return fstype in NETWORK_TYPES or fstype == "fuse" or fstype.startswith("fuse.")
