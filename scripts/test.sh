#!/usr/bin/env bash
# `make test`: the whole test suite in two lanes side by side, each a pytest run or two after another.
# The `k8s` tests spend most of their time waiting on the cluster (pods starting, images importing), so
# the second lane runs them and then the training recipes and the ZeroClaw adapter's tests, while the first
# runs the rest; without a cluster the k8s tests skip at once. Both lanes share one harness-bundle cache
# (bundles are built under a lock per key, so each is built once). The second lane's output follows the
# first's; the exit status is non-zero when any run failed. Ctrl-C or a kill stops both.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/orchard-test.XXXXXX")
lane_pid=""
cleanup() {
  if [ -n "$lane_pid" ] && kill -0 "$lane_pid" 2>/dev/null; then
    pkill -INT -P "$lane_pid" 2>/dev/null; wait "$lane_pid" 2>/dev/null
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export ORCHARD_TEST_BUNDLE_CACHE="$scratch/bundles"
pytest() { "$PYTHON" -m pytest -q -ra -p no:cacheprovider "$@"; }
(
  pytest -m k8s --durations=10 tests; k8s=$?
  pytest -m "not k8s" --durations=10 tests/recipes adapters/zeroclaw/tests; rest=$?
  [ "$k8s" -eq 0 ] && [ "$rest" -eq 0 ]
) > "$scratch/second-lane.log" 2>&1 &
lane_pid=$!
pytest -m "not k8s" --durations=30 --ignore=tests/recipes tests
first=$?
wait "$lane_pid"
second=$?
lane_pid=""
echo "=== the second lane (k8s tests, training recipes, the ZeroClaw adapter), run beside the first ==="
cat "$scratch/second-lane.log"
echo "=== first lane: exit status $first; second lane: exit status $second ==="
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
