#!/usr/bin/env bash
set -euo pipefail

WORKSPACE="${1:-workspace}"
python3 - "$WORKSPACE" <<'PY'
import collections, json, re, sys

workspace = sys.argv[1]
text = open(f"{workspace}/note.txt").read()
words = text.split()
cleaned = [re.sub(r"[^\w]", "", w).lower() for w in words]
counts = {"lines": len(text.splitlines()), "words": len(words),
          "most_common": collections.Counter(w for w in cleaned if w).most_common(1)[0][0]}
json.dump(counts, open(f"{workspace}/counts.json", "w"), indent=2)
PY
