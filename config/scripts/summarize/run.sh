#!/bin/sh
# A stand-in for an AI agent. Every "model call" is reported on fd 3:
#   charge tokens N · charge tool_calls N · charge cost_usd X · tick (progress)
# With --forever it never stops spending: the budget guard has to stop it.
set -eu
cat >/dev/null   # the run context; this demo does not need it
docs=${STEWARD_CONFIG_DIR:-.}/data/summarize   # readable: [sandbox] read in the workflow
words=$(cat "$docs"/*.txt | wc -w)
i=0
while :; do
  i=$((i + 1))
  echo "charge tokens 900" >&3
  echo "charge cost_usd 0.004" >&3
  echo "tick" >&3
  if [ "${1:-}" != "--forever" ] && [ "$i" -ge 3 ]; then break; fi
  sleep 0.1
done
echo "charge tool_calls 1" >&3
printf '{"summaries": %s, "words": %s}\n' "$i" "$words"
