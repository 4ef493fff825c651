#!/usr/bin/env bash
# A slow "parallel file system" on one machine, for tier studies without a cluster: an ext4 file
# system on a loop device (direct I/O to its image, so the host's page cache does not serve it
# twice) whose reads, and writes where asked, are throttled by the block-I/O cgroup for the
# processes run through `run`. The fast tier is whatever else the machine has (the local disk,
# /dev/shm).
#
#   sudo scripts/slow_pfs.sh up [--mount DIR] [--size 8G] [--read-mibps 100] [--read-iops 1000]
#                               [--write-mibps N] [--write-iops N] [--image PATH]
#   sudo scripts/slow_pfs.sh run -- mpiexec -n 2 dlio-mpi run ...   # throttled while it runs
#   sudo scripts/slow_pfs.sh status
#   sudo scripts/slow_pfs.sh down
#
# Writes are not throttled unless --write-mibps or --write-iops is given (0: no limit).
#
# Needs root, a loop device, and cgroup v1's blkio controller (blkio.throttle.read_bps_device,
# read_iops_device, write_bps_device, write_iops_device) or cgroup v2's io controller (io.max:
# rbps, riops, wbps, wiops). The throttle acts on the block device: reads the page cache serves
# are not slowed, so read the slow tier with reader.odirect: true or reader.drop_page_cache:
# true, or it is fast after the first epoch. Buffered writes are throttled only in part: the
# throttle sees a write when its pages reach the device. Under cgroup v2 (io and memory
# controllers) the kernel's writeback is charged to the writer's group; under cgroup v1 it is
# not: only direct I/O and the pages the writer's own fsync flushes are slowed, and whatever the
# kernel's flusher threads wrote back before (past vm.dirty_background_bytes) goes at full
# speed. So write the slow tier with O_DIRECT (checkpoint.odirect: true,
# checkpoint.drain.odirect: true; dd oflag=direct, fio --direct=1) for a write limit that
# holds under either; `status` says which this machine has. Measured on a cgroup v1 VM with
# --write-mibps 50 (200 MiB by dd through `run`): oflag=direct 52 MiB/s, buffered with
# conv=fsync 45 MiB/s (all flushed by the fsync), buffered alone 486 MiB/s (into the page
# cache), the same direct write outside `run` 1,470 MiB/s.
set -euo pipefail

STATE=/run/dlio-mpi-slow-pfs.env
GROUP=dlio-mpi-slow-pfs

die() { echo "slow_pfs.sh: $*" >&2; exit 2; }

limit() {  # a write limit for io.max and the messages: 0 is none
    if [[ $1 == 0 ]]; then echo max; else echo "$1"; fi
}

cgroup_dir() {  # the throttled group's folder and the controller's flavour (v1 or v2)
    if [[ -d /sys/fs/cgroup/blkio ]]; then
        echo "/sys/fs/cgroup/blkio/$GROUP v1"
    elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
        echo "/sys/fs/cgroup/$GROUP v2"
    else
        die "no block-I/O cgroup controller (cgroup v1 blkio or v2 io) on this machine"
    fi
}

up() {
    local mount=/mnt/slow-pfs size=8G mibps=100 iops=1000 wmibps=0 wiops=0 image=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --mount) mount=$2; shift 2 ;;
            --size) size=$2; shift 2 ;;
            --read-mibps) mibps=$2; shift 2 ;;
            --read-iops) iops=$2; shift 2 ;;
            --write-mibps) wmibps=$2; shift 2 ;;
            --write-iops) wiops=$2; shift 2 ;;
            --image) image=$2; shift 2 ;;
            *) die "unknown option $1 (expected --mount, --size, --read-mibps, --read-iops, --write-mibps, --write-iops, --image)" ;;
        esac
    done
    local n
    for n in "$mibps" "$iops" "$wmibps" "$wiops"; do
        [[ $n =~ ^(0|[1-9][0-9]*)$ ]] || die "limits are whole numbers (0: none for writes), not $n"
    done
    [[ $EUID -eq 0 ]] || die "needs root (losetup, mount, cgroups)"
    [[ -e $STATE ]] && die "already up ($STATE); run: $0 down"
    [[ -e $mount && -n "$(ls -A "$mount" 2>/dev/null)" ]] && die "$mount exists and is not empty"
    image=${image:-/var/tmp/dlio-mpi-slow-pfs.img}
    [[ -e $image ]] && die "$image exists: not ours to overwrite (give --image)"
    read -r group flavour <<<"$(cgroup_dir)"
    truncate -s "$size" "$image"
    local loop
    loop=$(losetup --direct-io=on --find --show "$image")
    mkfs.ext4 -q -F "$loop"
    mkdir -p "$mount"
    mount "$loop" "$mount"
    chmod 1777 "$mount"
    local dev bps=$((mibps * 1024 * 1024)) wbps=$((wmibps * 1024 * 1024))
    dev=$(lsblk -dno MAJ:MIN "$loop" | tr -d ' ')
    mkdir -p "$group"
    if [[ $flavour == v1 ]]; then
        echo "$dev $bps" >"$group/blkio.throttle.read_bps_device"
        echo "$dev $iops" >"$group/blkio.throttle.read_iops_device"
        # 0 removes a v1 rule: no limit
        echo "$dev $wbps" >"$group/blkio.throttle.write_bps_device"
        echo "$dev $wiops" >"$group/blkio.throttle.write_iops_device"
    else
        echo "$dev rbps=$bps riops=$iops wbps=$(limit "$wbps") wiops=$(limit "$wiops")" \
            >"$group/io.max"
    fi
    printf 'IMAGE=%q\nLOOP=%q\nMOUNT=%q\nGROUP_DIR=%q\n' "$image" "$loop" "$mount" "$group" >"$STATE"
    local writes="writes not throttled"
    if [[ $wmibps != 0 || $wiops != 0 ]]; then
        writes="writes to ${wmibps/#0/unlimited} MiB/s and ${wiops/#0/unlimited} IOPS"
        writes+=" (cgroup $flavour: write it with O_DIRECT, see the header)"
    fi
    echo "slow PFS up: $mount (ext4 on $loop, image $image, $size), reads throttled to" \
         "$mibps MiB/s and $iops IOPS, $writes, for the processes run through:" \
         "$0 run -- COMMAND"
}

run() {
    [[ -e $STATE ]] || die "not up: run $0 up first"
    # shellcheck disable=SC1090
    source "$STATE"
    [[ ${1:-} == -- ]] && shift
    [[ $# -gt 0 ]] || die "run: give the command after --"
    echo $$ >"$GROUP_DIR/cgroup.procs"  # this shell, and so the command it becomes
    exec "$@"
}

status() {
    [[ -e $STATE ]] || { echo "slow PFS: down"; return; }
    # shellcheck disable=SC1090
    source "$STATE"
    echo "slow PFS: up at $MOUNT ($LOOP, image $IMAGE)"
    if [[ -f $GROUP_DIR/blkio.throttle.read_bps_device ]]; then
        echo "cgroup v1 (blkio): buffered writes' writeback is not throttled; write with O_DIRECT"
        local f
        for f in read_bps_device read_iops_device write_bps_device write_iops_device; do
            echo "$f: $(cat "$GROUP_DIR/blkio.throttle.$f")"
        done
    else
        echo "cgroup v2 (io.max): writeback of buffered writes is charged to the group"
        echo "io.max: $(cat "$GROUP_DIR/io.max")"
    fi
    df -h "$MOUNT" | tail -1
}

down() {
    [[ -e $STATE ]] || die "not up"
    # shellcheck disable=SC1090
    source "$STATE"
    umount "$MOUNT"
    losetup -d "$LOOP"
    rmdir "$GROUP_DIR" 2>/dev/null || echo "slow_pfs.sh: $GROUP_DIR still holds processes; left" >&2
    rm -f "$IMAGE" "$STATE"
    rmdir "$MOUNT" 2>/dev/null || true
    echo "slow PFS down"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    run) shift; run "$@" ;;
    status) status ;;
    down) down ;;
    *) die "usage: $0 up [--mount DIR] [--size 8G] [--read-mibps 100] [--read-iops 1000] [--write-mibps N] [--write-iops N] [--image PATH] | run -- COMMAND | status | down" ;;
esac
