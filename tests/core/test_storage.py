"""Where a path lives (``packload.core.storage``): mounts, filesystem kinds and the disk behind them,
on fixture ``/proc/mounts`` and ``/sys`` trees."""

from __future__ import annotations

import os

import pytest

from packload.core.storage import (
    Mount,
    disk_of,
    find_mount,
    is_fuse,
    is_network_fs,
    read_mounts,
    rotational,
    storage_facts,
    whole_disk,
)
from tests.machine_files import MOUNTS, write

# -- mounts and disks ------------------------------------------------------------------------------


def test_mounts_longest_prefix(tmp_path):
    mounts = read_mounts(write(tmp_path / "mounts", MOUNTS))
    assert len(mounts) == 10 and mounts[7].point == "/mnt/my files"  # octal escapes decoded

    def fstype(path):
        return find_mount(path, mounts).fstype

    assert fstype("/mnt/data/local/train/a.jpg") == "ext4"  # nested in the NFS mount: the longer one wins
    assert find_mount("/mnt/data/local", mounts).source == "/dev/nvme0n1p1"
    assert fstype("/mnt/data/train") == "nfs4"
    assert fstype("/mnt/dat/x") == "xfs"
    assert fstype("/mnt/datax/y") == "ext4"  # /mnt/dat is not a prefix of /mnt/datax at a / boundary
    assert fstype("/mnt/gcs/bucket/a.jpg") == "fuse.gcsfuse"
    assert fstype("/mnt/my files/a") == "fuse.sshfs"
    assert fstype("/var/lib/docker/overlay2/abc/merged/data") == "tmpfs"  # mounted last, hides the overlay
    assert find_mount("relative", mounts) is None


def test_network_and_fuse_filesystems():
    assert is_network_fs("nfs4") and is_network_fs("cifs") and is_network_fs("lustre")
    assert is_network_fs("fuse.gcsfuse") and is_network_fs("fuse.sshfs")
    assert is_fuse("fuseblk") and not is_network_fs("fuseblk")
    assert not is_network_fs("ext4") and not is_fuse("overlay")


@pytest.fixture()
def sysfs(tmp_path):
    """A sysfs with a spinning sda (partition sda2), an SSD nvme0n1 and a device-number link."""
    sys_root = tmp_path / "sys"
    write(sys_root / "block" / "sda" / "queue" / "rotational", "1\n")
    write(sys_root / "block" / "sda" / "sda2" / "partition", "2\n")
    (sys_root / "class" / "block").mkdir(parents=True)
    (sys_root / "class" / "block" / "sda2").symlink_to("../../block/sda/sda2")
    write(sys_root / "block" / "nvme0n1" / "queue" / "rotational", "0\n")
    (sys_root / "dev" / "block").mkdir(parents=True)
    (sys_root / "dev" / "block" / "8:2").symlink_to("../../block/sda/sda2")
    write(sys_root / "block" / "loop0" / "queue" / "rotational", "maybe\n")
    return sys_root


def test_partition_maps_to_its_disk(sysfs):
    assert whole_disk("sda2", sysfs) == "sda"  # through /sys/class/block/sda2/partition
    assert whole_disk("sda", sysfs) == "sda"
    assert whole_disk("nvme0n1p1", sysfs) == "nvme0n1"  # no sysfs entry for the partition: by name
    assert whole_disk("sdz9", sysfs) is None
    assert rotational("sda", sysfs) is True and rotational("nvme0n1", sysfs) is False
    assert rotational("loop0", sysfs) is None and rotational("missing", sysfs) is None
    assert disk_of("/dev/sda2", sysfs) == "sda"
    assert disk_of("/dev/nvme0n1p1", sysfs) == "nvme0n1"
    assert disk_of("overlay", sysfs) is None and disk_of("server:/export", sysfs) is None
    assert disk_of("/dev/root", sysfs, dev=os.makedev(8, 2)) == "sda"  # by device number


def test_storage_facts_on_fixture_mounts(tmp_path, sysfs):
    data = tmp_path / "data"
    data.mkdir()
    mounts = write(tmp_path / "mounts", f"/dev/sda2 / ext4 rw 0 0\n/dev/sda2 {os.path.realpath(tmp_path)} xfs rw 0 0\n")
    facts = storage_facts(str(data), str(mounts), str(sysfs))
    assert facts["fstype"] == "xfs" and facts["disk"] == "sda" and facts["rotational"] is True
    assert not facts["network"] and not facts["fuse"]


def test_known_mount_is_found_for_real_paths(tmp_path):
    mounts = [Mount("/dev/x", "/", "ext4", "rw")]
    assert find_mount(os.path.realpath(tmp_path), mounts).point == "/"


def test_reads_wait_on_network_and_fuse_storage_only(monkeypatch, tmp_path):
    """Readers read in parallel where each read waits a round trip: network and FUSE filesystems."""
    from packload.core import storage

    for fstype, waits in (("ext4", False), ("tmpfs", False), ("nfs4", True), ("fuse.sshfs", True), ("fuse", True)):
        monkeypatch.setattr(storage, "read_mounts", lambda path, fstype=fstype: [Mount("src", "/", fstype, "rw")])
        assert storage.reads_wait(tmp_path) is waits, fstype
