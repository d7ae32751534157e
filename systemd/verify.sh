#!/usr/bin/env bash
# Lint the unit without booting systemd: `verify` must print nothing, and the offline security
# score must be <= 4.0. ExecStart's binary is substituted by one that exists here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#^ExecStart=/opt/stgcnd/venv/bin/stgcnd#ExecStart=/bin/true#" "$here/stgcnd.service" \
  > "$tmp/stgcnd.service"
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$tmp/stgcnd.service" 2>&1 \
  | grep -v -e "^$" -e "Failed to connect to bus" -e "Cannot add dependency job" \
            -e "Failed to load configuration: No such file" -e "(this user|user stgcnd)" || true)
if [ -n "$out" ]; then
  echo "systemd-analyze verify reported:"; echo "$out"; exit 1
fi
score=$(systemd-analyze security --offline=yes "$tmp/stgcnd.service" 2>/dev/null \
  | sed -n 's/.*Overall exposure level for stgcnd.service: \([0-9.]*\).*/\1/p')
echo "systemd-analyze verify: clean; security exposure: ${score:-unknown}"
[ -n "$score" ] || { echo "could not read the exposure level"; exit 1; }
awk -v s="$score" 'BEGIN { exit (s <= 4.0) ? 0 : 1 }' || { echo "exposure $score > 4.0"; exit 1; }
