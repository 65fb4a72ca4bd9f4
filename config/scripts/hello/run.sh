#!/bin/sh
# Maker: reads the run context on stdin, prints its output (JSON) on stdout.
set -eu
context=$(cat)
name=$(printf '%s' "$context" | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
echo "charge tool_calls 1" >&3
echo "note greeting ${name:-world}" >&3
printf '{"greeting": "hello, %s", "run": "%s"}\n' "${name:-world}" "$STEWARD_RUN_ID"
