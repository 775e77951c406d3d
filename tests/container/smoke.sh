#!/usr/bin/env bash
# Build decider's image and run what it holds: tests/test_container.py.
#   tests/container/smoke.sh TAG
# The image is built by deploy/build_image.sh on a local Debian base (debootstrap; no
# image registry is reached) with chroot isolation. Its filesystem is then run as the
# image's user in new mount and network namespaces (loopback only: no network), since
# the OCI runtime cannot start containers on this kind of host (crun's setrlimit is
# refused); prints what it saw, exits non-zero at the first failed check.
set -euo pipefail
tag=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
ISOLATION=chroot "$here/deploy/build_image.sh" "$tag" --local-base
podman image inspect "$tag" --format \
  'user={{.Config.User}} ports={{range $p, $_ := .Config.ExposedPorts}}{{$p}} {{end}}health={{.Config.Healthcheck.Test}} entrypoint={{.Config.Entrypoint}}'
root=$(podman image mount "$tag")
trap 'podman image unmount "$tag" >/dev/null' EXIT
user=$(podman image inspect "$tag" --format '{{.Config.User}}')
unshare --mount --net --propagation private bash -s "$root" "$user" <<'INSIDE'
set -euo pipefail
root=$1 user=$2
ip link set lo up
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/tmp"
mount -t tmpfs tmpfs "$root/run"
in_image() {
  env -i DECIDER_CACHE_DIR=/opt/decider/models HOME=/tmp \
    /usr/sbin/chroot --userspec="$user" "$root" /opt/decider/.venv/bin/decider "$@"
}
echo "network: $(ip -o link | awk -F': ' '{print $2}' | tr '\n' ' ')"
# not through in_image: $! must be decider itself (env and chroot exec into it)
env -i DECIDER_CACHE_DIR=/opt/decider/models HOME=/tmp /usr/sbin/chroot --userspec="$user" \
  "$root" /opt/decider/.venv/bin/decider serve --config /etc/decider/config/decider.toml \
  > "$root/tmp/serve.log" 2>&1 &
serve=$!
trap 'kill -9 $serve 2>/dev/null || true' EXIT  # never left running, whatever fails
for _ in $(seq 120); do
  [ "$(in_image health 127.0.0.1:50051 2>/dev/null)" = SERVING ] && break
  kill -0 $serve 2>/dev/null || break
  sleep 1
done
echo "health: $(in_image health 127.0.0.1:50051 2>&1 || true)"
grep -o '"event": "serving"' "$root/tmp/serve.log" || tail -20 "$root/tmp/serve.log"
kill -TERM $serve
wait $serve && echo "stopped: exit 0"
INSIDE
podman image prune -f > /dev/null  # the images this tag replaced
