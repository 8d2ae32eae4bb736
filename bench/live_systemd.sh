#!/usr/bin/env bash
# The shipped unit (configs/systemd/serwatt.service) under a live systemd: a Debian
# bookworm tree booted with systemd as PID 1 in systemd-nspawn, running serwatt from
# this checkout beside a root-owned Python target whose script sits in /root (0700).
#
#   sudo bench/live_systemd.sh            # needs root, systemd-container, debootstrap
#   TREE=/var/lib/machines/serwatt-live KEEP_TREE=1 sudo -E bench/live_systemd.sh
#   bench/live_systemd.sh --dry-run       # no root: writes the installation into TREE
#                                         # (default a new temporary directory), says
#                                         # which tools are missing and the command that
#                                         # would boot it, and exits 0; nothing is booted
#
# Checks, each printed as HOLDS / FAILS with what was seen:
#   ready       the unit (Type=notify) reaches active/running: the daemon sent READY=1;
#               its STATUS= text is shown by systemd
#   watchdog    with WatchdogSec=6 (a drop-in; the unit ships 60), systemd's
#               WatchdogTimestamp advances and the service outlives 3 x WatchdogSec
#               without a watchdog restart
#   caps        /proc/<MainPID>/status of the daemon (a DynamicUser, not uid 0):
#               CapEff = CapPrm = CapAmb = CapBnd = CAP_DAC_READ_SEARCH + CAP_SYS_PTRACE +
#               CAP_SYS_NICE (0x880004), NoNewPrivs 1, Seccomp 2 (filter mode); a
#               py-spy child has the same effective set and filter
#   sampling    under that seccomp filter py-spy samples the target: serwatt_samples_total
#               of the target grows and it has no sampler_failed / ptrace_denied window
#   reload      `systemctl reload` (ExecReload: SIGHUP) is applied ("reloaded:" in the journal)
#   restart     after `kill -9 <MainPID>` systemd restarts it (Restart=on-failure,
#               RestartSec=5): a new MainPID, NRestarts 1, active again
#   stop        `systemctl stop` ends it cleanly (KillMode=mixed: the daemon closes its
#               runs and logs its window count; Result=success)
# The container, its network namespace and every process in it are gone when this exits.
# Exit status: 0 when every check holds, 1 when one fails, 2 when the container cannot boot.
set -euo pipefail

DRY_RUN=0
case ${1:-} in
    "") ;;
    --dry-run) DRY_RUN=1 ;;
    *) printf 'usage: %s [--dry-run]\n' "$0" >&2; exit 2 ;;
esac

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DRY_TREE=""  # the temporary tree a dry run made itself, removed at its end
if ((DRY_RUN)) && [[ -z ${TREE:-} ]]; then
    TREE=$(mktemp -d "${TMPDIR:-/tmp}/serwatt-live-dry.XXXXXX")
    DRY_TREE=$TREE
fi
TREE=${TREE:-/var/lib/machines/serwatt-live}
MACHINE=serwatt-live
VENV=${VENV:-$(readlink -f "$REPO/.venv")}
# the venv's interpreter lives outside it (pyenv): bind that too
PYHOME=$(sed -n 's/^home = \(.*\)\/bin$/\1/p' "$VENV/pyvenv.cfg")
PYROOT=${PYROOT:-$(dirname "$(dirname "$PYHOME")")}
LOG=${LOG:-/tmp/serwatt-live-systemd.log}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

FAILED=0
NSPAWN_PID=""
LEADER=""

say() { printf '%s\n' "$*"; }
check() { # name verdict detail
    printf '%-9s %-6s %s\n' "$1" "$2" "$3"
    [[ $2 == HOLDS ]] || FAILED=1
}

for tool in systemd-nspawn debootstrap nsenter; do
    command -v "$tool" >/dev/null && continue
    ((DRY_RUN)) && { say "dry run: missing $tool (apt-get install systemd-container debootstrap util-linux)"; continue; }
    say "missing $tool: apt-get install systemd-container debootstrap util-linux"; exit 2
done
((DRY_RUN)) || [[ $(id -u) == 0 ]] || { say "run as root (systemd-nspawn needs it)"; exit 2; }

if ((DRY_RUN)); then
    say "dry run: the installation goes into $TREE; no debootstrap, no boot"
elif [[ ! -x $TREE/lib/systemd/systemd ]]; then
    say "debootstrap bookworm into $TREE (a few minutes)"
    mkdir -p "$(dirname "$TREE")"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,python3,procps \
        bookworm "$TREE" "$MIRROR" >"$LOG.debootstrap" 2>&1
fi

# --- the installation inside the tree -------------------------------------------------
install -d "$TREE/opt/serwatt/bin" "$TREE/etc/serwatt" "$TREE/etc/systemd/system/serwatt.service.d" "$TREE/root"
cat >"$TREE/opt/serwatt/bin/serwatt" <<EOF
#!/bin/sh
# serwatt from the checkout bound at /opt/serwatt/src, with the venv bound at its own path
PYTHONPATH=/opt/serwatt/src exec $VENV/bin/python -m serwatt "\$@"
EOF
chmod 755 "$TREE/opt/serwatt/bin/serwatt"
install -m 644 "$REPO/configs/systemd/serwatt.service" "$TREE/etc/systemd/system/serwatt.service"
cat >"$TREE/etc/systemd/system/serwatt.service.d/live-check.conf" <<'EOF'
[Service]
# short, so a few pings and a missed one show within seconds
WatchdogSec=6
EOF
cat >"$TREE/etc/serwatt/serwatt.yaml" <<'EOF'
listen: "127.0.0.1:9977"
sample_rate_hz: 50
window_s: 2
rescan_s: 1
targets:
  - name: trainer
    match:
      cmdline: 'serwatt-live-target'
record:
  dir: /var/lib/serwatt/runs
EOF
chmod 644 "$TREE/etc/serwatt/serwatt.yaml"
cat >"$TREE/root/serwatt-live-target.py" <<'EOF'
import json, pickle, time
data = {"k%d" % i: list(range(40)) for i in range(150)}
while True:
    for _ in range(20):
        pickle.loads(pickle.dumps(data))
    json.loads(json.dumps(data))
    time.sleep(0.01)
EOF
chmod 700 "$TREE/root"
cat >"$TREE/etc/systemd/system/serwatt-live-target.service" <<'EOF'
[Unit]
Description=a root Python process for serwatt to sample
[Service]
ExecStart=/usr/bin/python3 /root/serwatt-live-target.py
[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$TREE/etc/systemd/system/multi-user.target.wants"
for unit in serwatt.service serwatt-live-target.service; do
    ln -sfn "/etc/systemd/system/$unit" "$TREE/etc/systemd/system/multi-user.target.wants/$unit"
done

NSPAWN=(systemd-nspawn --boot --register=no --keep-unit --private-network --console=read-only
    -D "$TREE" --machine="$MACHINE"
    --bind-ro="$REPO:/opt/serwatt/src" --bind-ro="$VENV" --bind-ro="$PYROOT")
if ((DRY_RUN)); then
    say "dry run: would boot: ${NSPAWN[*]}"
    [[ -n $DRY_TREE && -z ${KEEP_TREE:-} ]] && rm -rf "$DRY_TREE"
    exit 0
fi

# --- boot -------------------------------------------------------------------------------
cleanup() {
    if [[ -n $LEADER ]] && kill -0 "$LEADER" 2>/dev/null; then
        nsenter -t "$LEADER" -m -u -i -n -p -- systemctl poweroff >/dev/null 2>&1 || true
    fi
    if [[ -n $NSPAWN_PID ]]; then
        for _ in $(seq 1 30); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 1; done
        if kill -0 "$NSPAWN_PID" 2>/dev/null; then kill -KILL "$NSPAWN_PID" 2>/dev/null || true; fi
        wait "$NSPAWN_PID" 2>/dev/null || true
    fi
    if [[ -z ${KEEP_TREE:-} ]]; then
        rm -f "$TREE/etc/systemd/system/multi-user.target.wants/serwatt"*.service
    fi
}
trap cleanup EXIT

# --register=no --keep-unit: no machined or host systemd needed (the host may not run
# systemd); --private-network: its own loopback, so :9977 cannot clash with the host.
"${NSPAWN[@]}" >"$LOG" 2>&1 &
NSPAWN_PID=$!

for _ in $(seq 1 60); do
    LEADER=$(ps -o pid= --ppid "$NSPAWN_PID" | head -1 | tr -d ' ' || true)
    [[ -n $LEADER ]] && nsenter -t "$LEADER" -m -u -i -n -p -- systemctl is-system-running 2>/dev/null \
        | grep -qE 'running|degraded' && break
    kill -0 "$NSPAWN_PID" 2>/dev/null || break
    sleep 1
done
if ! kill -0 "$NSPAWN_PID" 2>/dev/null || [[ -z $LEADER ]]; then
    say "the container did not boot; systemd-nspawn said:"
    cat "$LOG"
    exit 2
fi
inside() { nsenter -t "$LEADER" -m -u -i -n -p -- "$@"; }
prop() { inside systemctl show serwatt -p "$1" --value; }
metrics() {
    inside /usr/bin/python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9977/metrics", timeout=5).read().decode())'
}
samples() { metrics | awk '/^serwatt_samples_total\{.*target="trainer"/ {s += $2} END {print s + 0}'; }
say "booted: systemd $(inside systemctl --version | head -1 | cut -d' ' -f2) in $TREE (nspawn pid $NSPAWN_PID, leader $LEADER)"

wait_active() { # seconds
    for _ in $(seq 1 "$1"); do
        [[ $(prop ActiveState)/$(prop SubState) == active/running ]] && return 0
        sleep 1
    done
    return 1
}

# --- ready ------------------------------------------------------------------------------
if wait_active 60; then
    check ready HOLDS "active/running, MainPID $(prop MainPID), status: $(prop StatusText)"
else
    check ready FAILS "$(prop ActiveState)/$(prop SubState) Result=$(prop Result); journal: $(inside journalctl -u serwatt -n 20 --no-pager)"
    exit 1
fi
PID=$(prop MainPID)

# --- watchdog ---------------------------------------------------------------------------
w1=$(prop WatchdogTimestampMonotonic)
sleep 18
w2=$(prop WatchdogTimestampMonotonic)
restarts=$(prop NRestarts)
if [[ $w1 != "$w2" && $w2 != 0 && $restarts == 0 && $(prop MainPID) == "$PID" ]]; then
    check watchdog HOLDS "WatchdogUSec $(prop WatchdogUSec); last ping moved ${w1} -> ${w2} us over 18 s, NRestarts 0"
else
    check watchdog FAILS "WatchdogTimestampMonotonic $w1 -> $w2, NRestarts $restarts, MainPID $PID -> $(prop MainPID)"
fi

# --- capabilities and seccomp -------------------------------------------------------------
want=0000000000880004
status=$(inside cat "/proc/$PID/status")
field() { awk -v k="$1:" '$1 == k {print $2}' <<<"$status"; }
uid=$(field Uid)
caps_ok=1
for k in CapEff CapPrm CapAmb CapBnd; do [[ $(field "$k") == "$want" ]] || caps_ok=0; done
[[ $(field NoNewPrivs) == 1 && $(field Seccomp) == 2 && $uid != 0 ]] || caps_ok=0
spy_line="no py-spy child seen"
for _ in $(seq 1 20); do
    spy=$(inside ps -o pid=,comm= --ppid "$PID" | awk '$2 == "py-spy" {print $1; exit}')
    if [[ -n $spy ]]; then
        spy_status=$(inside cat "/proc/$spy/status" 2>/dev/null || true)
        spy_eff=$(awk '$1 == "CapEff:" {print $2}' <<<"$spy_status")
        spy_sec=$(awk '$1 == "Seccomp:" {print $2}' <<<"$spy_status")
        [[ -n $spy_eff ]] && break
    fi
    sleep 0.5
done
if [[ -n ${spy_eff:-} ]]; then
    spy_line="py-spy pid $spy CapEff $spy_eff Seccomp $spy_sec"
    [[ $spy_eff == "$want" && $spy_sec == 2 ]] || caps_ok=0
else
    caps_ok=0
fi
detail="uid $uid CapEff $(field CapEff) CapPrm $(field CapPrm) CapAmb $(field CapAmb) CapBnd $(field CapBnd) NoNewPrivs $(field NoNewPrivs) Seccomp $(field Seccomp); $spy_line"
if ((caps_ok)); then check caps HOLDS "$detail"; else check caps FAILS "$detail (want $want)"; fi

# --- sampling under the filter ---------------------------------------------------------------
s1=$(samples)
sleep 8
s2=$(samples)
errors=$(metrics | grep '^serwatt_sampler_errors_total{' | grep 'target="trainer"' | grep -E 'sampler_failed|ptrace_denied|internal' || true)
if awk -v a="$s1" -v b="$s2" 'BEGIN {exit !(b > a && a > 0)}' && [[ -z $errors ]]; then
    check sampling HOLDS "serwatt_samples_total{target=trainer} $s1 -> $s2 over 8 s, no sampler_failed/ptrace_denied"
else
    check sampling FAILS "samples $s1 -> $s2; errors: ${errors:-none}; journal: $(inside journalctl -u serwatt -n 15 --no-pager)"
fi

# --- reload -----------------------------------------------------------------------------
inside systemctl reload serwatt
sleep 4
if inside journalctl -u serwatt --no-pager | grep -q 'reloaded:'; then
    check reload HOLDS "systemctl reload -> $(inside journalctl -u serwatt --no-pager | grep 'reloaded:' | tail -1 | sed 's/.*serwatt.daemon: //')"
else
    check reload FAILS "no 'reloaded:' in the journal"
fi

# --- restart after kill -9 -------------------------------------------------------------------
inside kill -9 "$PID"
sleep 2
new=""
for _ in $(seq 1 30); do
    new=$(prop MainPID)
    if [[ $new != 0 && $new != "$PID" ]] && wait_active 1; then break; fi
    sleep 1
done
if [[ $new != 0 && $new != "$PID" && $(prop NRestarts) == 1 ]] && wait_active 5; then
    check restart HOLDS "kill -9 $PID -> restarted as $new, NRestarts $(prop NRestarts), active/running"
else
    check restart FAILS "MainPID $PID -> $new, NRestarts $(prop NRestarts), $(prop ActiveState)/$(prop SubState)"
fi

# --- stop -------------------------------------------------------------------------------
inside systemctl stop serwatt
result=$(prop Result)
stopped=$(inside journalctl -u serwatt --no-pager | grep 'stopped:' | tail -1 | sed 's/.*serwatt.daemon: //')
if [[ $result == success && $(prop ActiveState) == inactive && -n $stopped ]]; then
    check stop HOLDS "Result=success, exit $(prop ExecMainStatus); $stopped"
else
    check stop FAILS "Result=$result $(prop ActiveState), exit $(prop ExecMainStatus); journal: $(inside journalctl -u serwatt -n 10 --no-pager)"
fi

exit "$FAILED"
