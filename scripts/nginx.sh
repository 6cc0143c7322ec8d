#!/bin/sh
# nginx for the fleet bench and tests: the Debian package, run as a private process per folder.
#
#   scripts/nginx.sh install        install nginx with apt-get if it is missing (needs root)
#   scripts/nginx.sh start DIR      start nginx on DIR/nginx.conf (pid, logs, temp files in DIR)
#   scripts/nginx.sh reload DIR     graceful reload: new workers take the new DIR/nginx.conf,
#                                   old workers finish the requests they hold, none is dropped
#   scripts/nginx.sh stop DIR       graceful stop (quit), then wait for the master to exit
#
# The package's own service is never started: its postinst is kept from starting it, and the
# private instances listen only where DIR/nginx.conf says.
set -eu

nginx_bin() {
    command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true
}

install_nginx() {
    if [ -n "$(nginx_bin)" ]; then
        return 0
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "nginx.sh: nginx is not installed and installing it needs root (apt-get install nginx)" >&2
        exit 3
    fi
    # keep the package from starting its own service (port 80) while it installs
    policy=/usr/sbin/policy-rc.d
    created=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends nginx >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends nginx >/dev/null; }
    [ "$created" = 1 ] && rm -f "$policy"
    [ -n "$(nginx_bin)" ] || { echo "nginx.sh: apt-get did not install nginx" >&2; exit 3; }
}

cmd=${1:-}
case "$cmd" in
    install)
        install_nginx
        nginx_bin
        ;;
    start|reload|stop)
        dir=${2:?usage: nginx.sh $cmd DIR}
        dir=$(cd "$dir" && pwd)
        install_nginx
        bin=$(nginx_bin)
        case "$cmd" in
            start)
                "$bin" -t -q -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf"
                "$bin" -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf"
                ;;
            reload)
                "$bin" -t -q -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf"
                "$bin" -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" -s reload
                ;;
            stop)
                pid=$(cat "$dir/nginx.pid" 2>/dev/null || true)
                "$bin" -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" -s quit 2>/dev/null || true
                i=0
                while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do
                    sleep 0.1; i=$((i + 1))
                done
                if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
                ;;
        esac
        ;;
    *)
        echo "usage: nginx.sh install | start DIR | reload DIR | stop DIR" >&2
        exit 2
        ;;
esac
