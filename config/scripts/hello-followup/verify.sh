#!/bin/sh
# Checker: passes when the maker named the upstream run it followed.
set -eu
case "$(cat)" in
  *'"followed":"'?*) echo pass ;;
  *) echo fail; echo "the follower did not name its upstream run" ;;
esac
