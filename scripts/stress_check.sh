#!/usr/bin/env bash
# stress_check.sh [RELEASE_RUNS] — the test suite under a load that keeps every core busy:
# `stress-ng --cpu N` (N = the cores) runs for the whole check while scripts/test.sh runs
# all four stages once, then the release stage again until it has passed RELEASE_RUNS
# times in a row (default 3). A test that passes only on an idle machine (a wall-clock
# limit, a race that needs luck) fails here. Stops at the first failing run and says which;
# prints each run's time. Installs Debian's stress-ng when it is missing. Run by hand (an
# hour or more on 2 cores), not by CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
if ! command -v stress-ng >/dev/null; then
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends stress-ng
fi
cores=$(nproc)
stress-ng --cpu "$cores" --quiet &
load=$!
trap 'kill $load 2>/dev/null || true' EXIT
echo "stress_check: stress-ng --cpu $cores (pid $load); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
SECONDS=0
bash "$root/scripts/test.sh"
echo "stress_check: run 1 (all stages) passed in ${SECONDS} s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 2; i <= runs; i++)); do
  SECONDS=0
  KVSCOPE_TEST_STAGES=release bash "$root/scripts/test.sh"
  echo "stress_check: run $i (release) passed in ${SECONDS} s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "stress_check: the release stage passed $runs times in a row and the sanitizer stages once, under stress-ng --cpu $cores"
