#!/usr/bin/env bash
# A slow "parallel file system" on one machine, for tier studies without a cluster: an ext4 file
# system on a loop device (direct I/O to its image, so the host's page cache does not serve it
# twice) whose reads are throttled by the block-I/O cgroup for the processes run through `run`.
# The fast tier is whatever else the machine has (the local disk, /dev/shm).
#
#   sudo scripts/slow_pfs.sh up [--mount DIR] [--size 8G] [--read-mibps 100] [--read-iops 1000]
#   sudo scripts/slow_pfs.sh run -- mpiexec -n 2 dlio-mpi run ...   # throttled while it runs
#   sudo scripts/slow_pfs.sh status
#   sudo scripts/slow_pfs.sh down
#
# Needs root, a loop device, and cgroup v1's blkio controller (blkio.throttle.read_bps_device,
# read_iops_device) or cgroup v2's io controller (io.max). The throttle acts on the block
# device: reads the page cache serves are not slowed, so read the slow tier with
# reader.odirect: true or reader.drop_page_cache: true, or it is fast after the first epoch.
set -euo pipefail

STATE=/run/dlio-mpi-slow-pfs.env
GROUP=dlio-mpi-slow-pfs

die() { echo "slow_pfs.sh: $*" >&2; exit 2; }

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
    local mount=/mnt/slow-pfs size=8G mibps=100 iops=1000 image=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --mount) mount=$2; shift 2 ;;
            --size) size=$2; shift 2 ;;
            --read-mibps) mibps=$2; shift 2 ;;
            --read-iops) iops=$2; shift 2 ;;
            --image) image=$2; shift 2 ;;
            *) die "unknown option $1 (expected --mount, --size, --read-mibps, --read-iops, --image)" ;;
        esac
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
    local dev bps=$((mibps * 1024 * 1024))
    dev=$(lsblk -dno MAJ:MIN "$loop" | tr -d ' ')
    mkdir -p "$group"
    if [[ $flavour == v1 ]]; then
        echo "$dev $bps" >"$group/blkio.throttle.read_bps_device"
        echo "$dev $iops" >"$group/blkio.throttle.read_iops_device"
    else
        echo "$dev rbps=$bps riops=$iops" >"$group/io.max"
    fi
    printf 'IMAGE=%q\nLOOP=%q\nMOUNT=%q\nGROUP_DIR=%q\n' "$image" "$loop" "$mount" "$group" >"$STATE"
    echo "slow PFS up: $mount (ext4 on $loop, image $image, $size), reads throttled to" \
         "$mibps MiB/s and $iops IOPS for the processes run through: $0 run -- COMMAND"
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
        echo "read_bps_device: $(cat "$GROUP_DIR/blkio.throttle.read_bps_device")"
        echo "read_iops_device: $(cat "$GROUP_DIR/blkio.throttle.read_iops_device")"
    else
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
    *) die "usage: $0 up [--mount DIR] [--size 8G] [--read-mibps 100] [--read-iops 1000] [--image PATH] | run -- COMMAND | status | down" ;;
esac
