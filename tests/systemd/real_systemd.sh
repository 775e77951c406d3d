#!/usr/bin/env bash
# decider under a real systemd: PID 1 of a PID namespace, in a Debian rootfs.
#   tests/systemd/real_systemd.sh WORKDIR
# Needs root, debootstrap, unshare/nsenter (util-linux) and the package registries.
# Builds WORKDIR/rootfs once (debootstrap, a few minutes), installs this checkout's
# decider there with the shipped unit and config, boots systemd and checks: active after
# READY, reload, a hung engine replaced by the daemon, a stuck daemon restarted by the
# watchdog, stop drains and exits 0,
# journal JSON lines. Prints what it saw; exits non-zero at the first failed check.
set -euo pipefail
work=$(realpath "$1")
root="$work/rootfs"
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
say() { printf '\n== %s\n' "$*"; }

if [ ! -x "$root/lib/systemd/systemd" ]; then
  say "debootstrap bookworm into $root"
  rm -rf "$root"
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,python3,python3-venv,libgomp1,ca-certificates \
    bookworm "$root" > "$work/debootstrap.log" 2>&1 || { echo "DEBOOTSTRAP FAILED"; exit 3; }
fi

say "install decider (a wheel of this checkout) into /opt/decider/.venv, offline"
rm -rf "$work/wheels" && mkdir -p "$work/wheels"
"$py" -m pip wheel -q --no-deps -w "$work/wheels" "$here"
# the llama-cpp-python wheel this machine already built (pip's cache), else built here
find "${PIP_CACHE_DIR:-$HOME/.cache/pip}/wheels" -name 'llama_cpp_python-0.3.36-*.whl' \
  -exec cp {} "$work/wheels/" \; 2>/dev/null || true
wheel=$(ls "$work"/wheels/decider_daemon-*.whl)
CMAKE_ARGS=-DGGML_NATIVE=OFF "$py" -m pip wheel -q --find-links "$work/wheels" \
  -w "$work/wheels" "$wheel[llama]"
rm -rf "$root/wheels" && cp -r "$work/wheels" "$root/wheels"
[ -x "$root/opt/decider/.venv/bin/python" ] || chroot "$root" python3 -m venv /opt/decider/.venv
chroot "$root" /opt/decider/.venv/bin/pip install -q --no-index --find-links /wheels \
  "/wheels/$(basename "$wheel")[llama]"
chroot "$root" /opt/decider/.venv/bin/pip install -q --no-index --no-deps --force-reinstall \
  "/wheels/$(basename "$wheel")"

say "unit, config, user; test drop-in: fast watchdog and the fault hook"
chroot "$root" sh -c 'id decider >/dev/null 2>&1 || useradd --system --home-dir /var/lib/decider --shell /usr/sbin/nologin decider'
install -D -m 0644 "$here/deploy/decider.toml" "$root/etc/decider/decider.toml"
sed -i 's/^engine_call_limit_seconds = .*/engine_call_limit_seconds = 3/; s/^# n_ctx = 8192/n_ctx = 1024/' \
  "$root/etc/decider/decider.toml"
install -m 0644 "$here/deploy/decider.service" "$root/etc/systemd/system/decider.service"
mkdir -p "$root/etc/systemd/system/decider.service.d"
cat > "$root/etc/systemd/system/decider.service.d/test.conf" <<'CONF'
[Service]
WatchdogSec=8
Environment=DECIDER_FAULT_FILE=/run/decider/fault
CONF
chroot "$root" systemctl enable decider.service >/dev/null 2>&1
chroot "$root" systemctl mask systemd-networkd.service systemd-resolved.service \
  systemd-timesyncd.service getty@tty1.service console-getty.service >/dev/null 2>&1 || true

say "boot systemd as PID 1 of a new PID namespace"
unshare --pid --fork --mount --propagation private bash -c "
  mount --bind '$root' '$root'  # systemd sets up service namespaces only on a mount point
  mount -t proc proc '$root/proc'
  mount --rbind /sys '$root/sys'
  mount --rbind /dev '$root/dev'
  mount -t tmpfs tmpfs '$root/run'
  mount -t tmpfs tmpfs '$root/tmp'
  exec chroot '$root' /lib/systemd/systemd --system
" > "$work/systemd-console.log" 2>&1 &
unshare_pid=$!
cleanup() {
  pkill -9 -P "$unshare_pid" 2>/dev/null || true
  kill -9 "$unshare_pid" 2>/dev/null || true
  wait "$unshare_pid" 2>/dev/null || true
}
trap cleanup EXIT
pid1=""
for _ in $(seq 100); do
  pid1=$(pgrep -P "$unshare_pid" -x systemd || true)
  [ -n "$pid1" ] && break
  sleep 0.1
done
[ -n "$pid1" ] || { echo "systemd did not start"; cat "$work/systemd-console.log"; exit 1; }
in_ns() { nsenter -t "$pid1" -m -p chroot "$root" "$@"; }

wait_active() {
  for _ in $(seq 300); do
    state=$(in_ns systemctl is-active decider 2>/dev/null || true)
    [ "$state" = active ] && return 0
    sleep 1
  done
  echo "decider never became active (last: $state)"
  in_ns journalctl -u decider --no-pager | tail -30
  return 1
}

say "start: active only after READY=1"
wait_active
in_ns systemctl show decider -p Type -p NotifyAccess -p WatchdogUSec -p StatusText
in_ns /opt/decider/.venv/bin/decider health unix:///run/decider/decider.sock
in_ns /opt/decider/.venv/bin/decider run gemma-3-270m "I was charged twice" \
  -q "Does the customer want a refund?" --server unix:///run/decider/decider.sock
main1=$(in_ns systemctl show decider -p MainPID --value)

say "systemctl reload"
reloads() { in_ns journalctl -u decider --no-pager -o cat | grep -c '"configuration reloaded"' || true; }
before=$(reloads)
sed -i 's/^max_batch = .*/max_batch = 8/' "$root/etc/decider/decider.toml"
in_ns systemctl reload decider
# systemd 252 ends the reload job when ExecReload's kill returns; decider's RELOADING=1
# may come after that, so wait for the journal, not for systemctl
for _ in $(seq 240); do [ "$(reloads)" -gt "$before" ] && break; sleep 0.5; done
[ "$(reloads)" -gt "$before" ] || {
  echo "reload not applied"; in_ns journalctl -u decider --no-pager -o cat | tail -20; exit 1; }
echo "configuration reloaded (journal)"
wait_active

say "a hung engine: the daemon replaces it, the service stays active"
# counted, not grepped: the rootfs, and its journal, outlive a run
replaced() { in_ns journalctl -u decider --no-pager -o cat | grep -c '"engine replaced"' || true; }
before=$(replaced)
in_ns sh -c 'echo hang:60 > /run/decider/fault'
in_ns timeout 20 /opt/decider/.venv/bin/decider run gemma-3-270m "text" -q "ok?" \
  --server unix:///run/decider/decider.sock 2>&1 | tail -1 || true
for _ in $(seq 60); do
  [ "$(replaced)" -gt "$before" ] && break
  sleep 1
done
[ "$(replaced)" -gt "$before" ] || { echo "the hung engine was not replaced"; exit 1; }
in_ns journalctl -u decider --no-pager -o cat | grep -E '"engine replaced"|no progress' | tail -2
[ "$(in_ns systemctl show decider -p MainPID --value)" = "$main1" ] || {
  echo "the service restarted; the daemon should have replaced its engine"; exit 1; }
wait_active
in_ns /opt/decider/.venv/bin/decider health unix:///run/decider/decider.sock
echo "engine replaced: MainPID still $main1"

say "a stuck daemon: the watchdog restarts the service"
in_ns sh -c 'kill -STOP $(systemctl show decider -p MainPID --value)'
restarted=""
for _ in $(seq 90); do
  sleep 1
  main=$(in_ns systemctl show decider -p MainPID --value)
  if [ "$main" != "$main1" ] && [ "$main" != 0 ]; then restarted=yes; break; fi
done
[ -n "$restarted" ] || { echo "no restart"; in_ns journalctl -u decider --no-pager | tail -20; exit 1; }
in_ns journalctl -u decider --no-pager | grep -E "Watchdog timeout|watchdog" | tail -3 || true
wait_active
echo "restarted: MainPID $main1 -> $(in_ns systemctl show decider -p MainPID --value)"

say "systemctl stop: drain, exit 0"
in_ns systemctl stop decider
in_ns systemctl show decider -p Result -p ExecMainStatus -p ActiveState

say "journal: JSON lines"
in_ns journalctl -u decider --no-pager -o cat | grep '^{' | tail -4
in_ns journalctl -u decider --no-pager -o cat | grep '^{' | tail -1 | "$py" -c 'import json,sys; json.loads(sys.stdin.read()); print("valid JSON")'

result=$(in_ns systemctl show decider -p Result --value)
status=$(in_ns systemctl show decider -p ExecMainStatus --value)
[ "$result" = success ] && [ "$status" = 0 ] || { echo "stop: Result=$result status=$status"; exit 1; }
say "all checks passed"
