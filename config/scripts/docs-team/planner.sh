#!/bin/sh
# The planner: gets the folded case as JSON on stdin and proposes one next move.
# It never invents the roster or the limits; steward checks both before anything runs.
case=$(cat)
done_by() { printf '%s' "$case" | grep -q "\"done_members\":\[[^]]*\"$1\""; }
if ! done_by researcher; then
  echo '{"action":"dispatch","member":"researcher","task":"summarise what shipped","needed_scope":["read:feeds"]}'
elif ! done_by writer; then
  echo '{"action":"dispatch","member":"writer","task":"draft the notes","needed_scope":["write:draft"]}'
else
  echo '{"action":"resolve","resolution":"release notes drafted","reason":"both members have receipts"}'
fi
