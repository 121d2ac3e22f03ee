#!/bin/bash
sort -k2 -n -r "$SCORES_FILE" | head -n 1 | cut -d' ' -f1 > /app/top.txt
