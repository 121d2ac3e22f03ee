#!/usr/bin/env bash
# `make test`: the whole test suite, as two pytest processes side by side. The `k8s` tests spend most of
# their time waiting on the cluster (pods starting, images importing), so they run beside the rest rather
# than after it; without a cluster they skip at once. Both share one harness-bundle cache (bundles are
# built under a lock per key, so each is built once). The k8s run's output follows the rest's; the exit
# status is non-zero when either failed. Ctrl-C or a kill stops both.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/orchard-test.XXXXXX")
k8s_pid=""
cleanup() {
  if [ -n "$k8s_pid" ] && kill -0 "$k8s_pid" 2>/dev/null; then
    kill -INT "$k8s_pid" 2>/dev/null; wait "$k8s_pid" 2>/dev/null
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export ORCHARD_TEST_BUNDLE_CACHE="$scratch/bundles"
"$PYTHON" -m pytest -q -ra -m k8s -p no:cacheprovider --durations=10 > "$scratch/k8s.log" 2>&1 &
k8s_pid=$!
"$PYTHON" -m pytest -q -ra -m "not k8s" --durations=30
rest=$?
wait "$k8s_pid"
k8s=$?
k8s_pid=""
echo "=== the k8s tests (run beside the rest above) ==="
cat "$scratch/k8s.log"
echo "=== not k8s: exit status $rest; k8s: exit status $k8s ==="
[ "$rest" -eq 0 ] && [ "$k8s" -eq 0 ]
