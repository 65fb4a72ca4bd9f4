#!/bin/sh
# Commit: the only side effect. Runs only when live and verify said pass.
set -eu
mkdir -p "$(dirname "$LEDGER")"
printf '%s %s\n' "$(date -u +%FT%TZ)" "$STEWARD_RUN_ID" >> "$LEDGER"
echo '{"ledger": "appended"}'
