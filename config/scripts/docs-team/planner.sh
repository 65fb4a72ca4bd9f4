#!/bin/sh
# The planner: gets the folded case as JSON on stdin and proposes one next move.
# It never invents the roster or the limits; steward checks both before anything runs.
# Publishing needs the `publish` scope, which [approval] gates: that turn waits for
# `steward case approve` before the publisher runs.
case=$(cat)
done_by() { printf '%s' "$case" | grep -q "\"done_members\":\[[^]]*\"$1\""; }
if ! done_by researcher; then
  echo '{"action":"dispatch","member":"researcher","task":"summarise what shipped","needed_scope":["read:feeds"]}'
elif ! done_by writer; then
  echo '{"action":"dispatch","member":"writer","task":"draft the notes","needed_scope":["write:draft"]}'
elif ! done_by publisher; then
  echo '{"action":"dispatch","member":"publisher","task":"publish the notes","needed_scope":["publish"]}'
else
  echo '{"action":"resolve","resolution":"release notes published","reason":"researched, drafted and published, each with a receipt"}'
fi
