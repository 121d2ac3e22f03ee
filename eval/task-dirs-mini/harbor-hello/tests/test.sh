#!/bin/bash
# Harbor's verifier: run from /tests, writes the reward to /logs/verifier (here as reward.json).
checks=0 passed=0
check() {  # check EXPECTED COMMAND...
  checks=$((checks + 1))
  if [ "$("${@:2}" 2>/dev/null)" = "$1" ]; then passed=$((passed + 1)); else echo "FAILED: ${*:2}"; fi
}
check "Hello, world!" /app/greet.sh
check "Hello, Ada!" /app/greet.sh Ada
check "Hello, Grace Hopper!" /app/greet.sh "Grace Hopper"
if [ "$passed" = "$checks" ]; then reward=1; else reward=0; fi
printf '{"reward": %s}\n' "$reward" > /logs/verifier/reward.json
