#!/bin/sh
# Checker: passes when the maker produced at least one summary.
set -eu
context=$(cat)
echo "confidence high" >&3
case "$context" in
  *'"summaries":0'*|*'"output":null'*) echo fail; echo "no summaries produced" ;;
  *'"summaries":'*) echo pass ;;
  *) echo fail; echo "output is not what the maker promised" ;;
esac
