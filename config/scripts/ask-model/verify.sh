#!/bin/sh
# Checker: passes when the maker produced a non-empty summary.
set -eu
context=$(cat)
case "$context" in
  *'"summary":""'*|*'"summary":null'*|*'"output":null'*) echo fail; echo "no summary" ;;
  *'"summary":'*) echo pass ;;
  *) echo fail; echo "output is not what the maker promised" ;;
esac
