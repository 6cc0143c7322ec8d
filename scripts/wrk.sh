#!/bin/sh
# wrk, the closed-loop HTTP load generator of bench/dataplane.py: the Debian package.
#
#   scripts/wrk.sh install     install wrk with apt-get if it is missing (needs root)
#   scripts/wrk.sh path        print the wrk binary's path (exit 1 when it is not installed)
set -eu

wrk_bin() {
    command -v wrk 2>/dev/null || { [ -x /usr/bin/wrk ] && echo /usr/bin/wrk; } || true
}

case "${1:-install}" in
    install)
        if [ -n "$(wrk_bin)" ]; then
            exit 0
        fi
        if [ "$(id -u)" != 0 ]; then
            echo "wrk.sh: wrk is not installed and installing it needs root (apt-get install wrk)" >&2
            exit 3
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk >/dev/null \
            || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive \
                 apt-get install -y --no-install-recommends wrk >/dev/null; }
        ;;
    path)
        p="$(wrk_bin)"
        [ -n "$p" ] || exit 1
        echo "$p"
        ;;
    *)
        echo "usage: scripts/wrk.sh install|path" >&2
        exit 2
        ;;
esac
