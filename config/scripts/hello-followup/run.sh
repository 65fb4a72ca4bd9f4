#!/bin/sh
# Maker of a follower: its context's trigger holds the upstream run that fired it
# (trigger.upstream: run_id, workflow, state, slot, output).
set -eu
context=$(cat)
upstream=$(printf '%s' "$context" | sed -n 's/.*"upstream_ids":"\([^"]*\)".*/\1/p')
greeting=$(printf '%s' "$context" | sed -n 's/.*"greeting":"\([^"]*\)".*/\1/p')
printf '{"followed": "%s", "greeting": "%s"}\n' "$upstream" "$greeting"
