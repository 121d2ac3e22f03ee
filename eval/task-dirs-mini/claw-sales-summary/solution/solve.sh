#!/usr/bin/env bash
set -euo pipefail

WORKSPACE="${1:-workspace}"
python3 - "$WORKSPACE" <<'PY'
import csv, json, sys
from collections import defaultdict

workspace = sys.argv[1]
with open(f"{workspace}/sales.csv") as f:
    rows = list(csv.DictReader(f))
by_region = defaultdict(float)
for row in rows:
    by_region[row["region"]] += float(row["amount"])
summary = {"total": sum(by_region.values()), "count": len(rows), "best_region": max(by_region, key=by_region.get)}
with open(f"{workspace}/summary.json", "w") as f:
    json.dump(summary, f, indent=2)
PY
