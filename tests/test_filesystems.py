"""A SQLite file on a network file system is refused: WAL there can corrupt the database."""

import logging
import os
from pathlib import Path

import pytest

from jupyter_agentruns.store import filesystems
from jupyter_agentruns.store.filesystems import network_filesystem

from conftest import submit


def escape(mount_point: Path) -> str:
    """A mount point as the kernel writes it in mountinfo."""
    text = str(mount_point).replace("\\", "\\134")
    return text.replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def mount_table(monkeypatch, where: Path, *mounts: tuple[Path, str]) -> None:
    """Make ``(mount point, type)`` the mount table, in mount order, as /proc/self/mountinfo has it."""
    lines = []
    for number, (mount_point, fstype) in enumerate(mounts, start=20):
        # Some lines have optional fields before the "-", some have none.
        optional = f" shared:{number}" if number % 2 else ""
        lines.append(
            f"{number} 1 0:{number} / {escape(mount_point)} rw,relatime{optional} - "
            f"{fstype} server:/export{number} rw"
        )
    table = where / "mountinfo"
    table.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(filesystems, "MOUNTINFO", str(table))


@pytest.fixture
def root(tmp_path):
    """The test's directory with its symlinks resolved, as the mount table names it."""
    return Path(os.path.realpath(tmp_path))


def directory(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_the_innermost_mount_decides_both_ways(monkeypatch, root):
    home = directory(root / "home")
    scratch = directory(home / "scratch")
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (home, "nfs4"), (scratch, "ext4"))
    assert network_filesystem(home / "agentruns.sqlite3") == "nfs4"
    assert network_filesystem(scratch / "agentruns.sqlite3") is None
    assert network_filesystem(root / "agentruns.sqlite3") is None


def test_a_mount_point_is_a_whole_directory_not_a_prefix_of_the_name(monkeypatch, root):
    home, home2 = directory(root / "home"), directory(root / "home2")
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (home, "nfs"))
    assert network_filesystem(home2 / "agentruns.sqlite3") is None
    assert network_filesystem(home / "agentruns.sqlite3") == "nfs"


def test_a_later_mount_on_the_same_point_hides_the_earlier(monkeypatch, root):
    data = directory(root / "data")
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (data, "nfs4"), (data, "ext4"))
    assert network_filesystem(data / "agentruns.sqlite3") is None


def test_a_mount_point_with_escaped_characters_is_found(monkeypatch, root):
    home = directory(root / "my home\tdir\\x")
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (home, "cifs"))
    assert network_filesystem(home / "agentruns.sqlite3") == "cifs"


def test_a_database_not_created_yet_is_judged_by_its_nearest_existing_directory(monkeypatch, root):
    home = directory(root / "home")
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (home, "nfs4"))
    db_path = home / "not" / "yet" / "agentruns.sqlite3"
    assert network_filesystem(db_path) == "nfs4"
    assert not db_path.parent.exists()


def test_a_symlink_is_followed_to_the_file_system_it_points_into(monkeypatch, root):
    local, home = directory(root / "local"), directory(root / "home")
    (local / "to-home").symlink_to(home)
    (home / "to-local").symlink_to(local)
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (home, "nfs4"))
    assert network_filesystem(local / "to-home" / "agentruns.sqlite3") == "nfs4"
    assert network_filesystem(home / "to-local" / "agentruns.sqlite3") is None


@pytest.mark.parametrize(
    "fstype, refused",
    [
        ("ext4", None),
        ("tmpfs", None),
        ("fuseblk", None),  # a local NTFS or exFAT disk through FUSE
        ("fusectl", None),
        ("nfs4", "nfs4"),
        ("smb3", "smb3"),
        ("9p", "9p"),
        ("fuse", "fuse"),
        ("fuse.sshfs", "fuse.sshfs"),
        ("fuse.s3fs", "fuse.s3fs"),
    ],
)
def test_network_and_fuse_types_are_refused_local_ones_are_not(monkeypatch, root, fstype, refused):
    disk = directory(root / "disk")
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (disk, fstype))
    assert network_filesystem(disk / "agentruns.sqlite3") == refused


def test_without_a_mount_table_nothing_is_refused(monkeypatch, root):
    monkeypatch.setattr(filesystems, "MOUNTINFO", str(root / "no-such-mountinfo"))
    assert network_filesystem(root / "agentruns.sqlite3") is None


# The server ------------------------------------------------------------------


@pytest.fixture
def fstype():
    """The type the mount table gives the database's directory; parametrize to change it."""
    return "nfs4"


@pytest.fixture
def agentruns_config(monkeypatch, root, fstype):
    """The database in a directory mounted as ``fstype``, the mount table faked before the server starts."""
    home = directory(root / "home")
    mount_table(monkeypatch, root, (Path("/"), "ext4"), (home, fstype))
    return {"db_path": str(home / "agentruns.sqlite3")}


@pytest.fixture
def extension_log():
    """Every record the extension logs, from before the server starts.

    Starting, the server replaces the handlers of the extension's logger and
    stops it propagating (caplog misses its first lines): a filter stays.
    """
    records = []

    def keep(record):
        records.append(record)
        return True

    logger = logging.getLogger("AgentRuns")
    logger.addFilter(keep)
    yield records
    logger.removeFilter(keep)


@pytest.mark.sqlite_only
async def test_a_database_on_nfs_is_never_opened_and_every_endpoint_answers_503(
    extension_log, agentruns_config, jp_serverapp, api
):
    answers = [
        await api.get("agents"),
        await api.get("runs"),
        await submit(api),
        await api.get("runs/x/events"),
    ]
    for response in answers:
        assert response.status_code == 503, response.request.url
        body = response.json()
        assert body.keys() == {"error", "message"}
        assert body["error"] == "store_unavailable"
        assert body["message"].startswith("The agentruns SQLite file ")
        assert "on a network file system (nfs4)" in body["message"]
        assert "c.AgentRuns.store_url" in body["message"]
    assert list(Path(agentruns_config["db_path"]).parent.iterdir()) == []

    logged = len(extension_log)
    await jp_serverapp._cleanup()
    assert all(record.levelno < logging.WARNING for record in extension_log[logged:])
    about_it = [r for r in extension_log if "network file system" in r.getMessage()]
    assert len(about_it) == 1
    assert about_it[0].levelno == logging.ERROR and about_it[0].exc_info is None
    assert about_it[0].getMessage().startswith("agentruns: the agentruns SQLite file ")


@pytest.mark.sqlite_only
@pytest.mark.parametrize("fstype", ["ext4"])
async def test_a_database_on_a_local_mount_is_used(agentruns_config, api):
    assert (await api.get("agents")).status_code == 200
    assert (await submit(api)).status_code == 201
    assert Path(agentruns_config["db_path"]).exists()
