#!/bin/sh
# Checker: a separate process that judges the maker's output (context.output on stdin).
# First stdout line pass | fail | escalate, or exit 0 | 1 | 2.
set -eu
context=$(cat)
case "$context" in
  *'"greeting":"hello, '?*) echo pass ;;
  *'"output":null'*) echo fail; echo "the maker printed nothing" ;;
  *) echo escalate; echo "unexpected greeting: a person should look" ;;
esac
