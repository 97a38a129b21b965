#!/usr/bin/env bash
# Runs accel_tests' hidden case "[.full_disk]" with a 1 MiB tmpfs at $ACCEL_FULL_DISK_DIR, mounted in a private
# mount namespace (unshare: as root, or as a user where user namespaces are allowed), so nothing outside sees it.
# Exits 77 (skipped) where no such file system can be mounted.
set -u
accel_tests=$1
dir=$(mktemp -d)
trap 'rmdir "$dir"' EXIT
if ! unshare -rm sh -c "mount -t tmpfs -o size=1m tmpfs '$dir'" 2>/dev/null; then
  echo "full_disk: cannot mount a tmpfs in a private mount namespace here (unshare -rm); skipped"
  exit 77
fi
ACCEL_FULL_DISK_DIR=$dir unshare -rm sh -c "mount -t tmpfs -o size=1m tmpfs '$dir' && exec '$accel_tests' '[.full_disk]'"
