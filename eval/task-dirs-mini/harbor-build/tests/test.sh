#!/bin/bash
# Harbor's verifier: run from /tests, writes the reward to /logs/verifier/reward.txt.
if [ "$(cat /app/top.txt 2>/dev/null)" = "bob" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
