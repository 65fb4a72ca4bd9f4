#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 600) one after another, new inputs going to
# a scratch corpus, then merges what is new into the committed corpus (libFuzzer -merge).
# Prints each target's exec count. Needs nightly and cargo-fuzz (cargo install cargo-fuzz).
# Usage: fuzz/run-all.sh [SECONDS [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config control_line feed marker queue_item webhook_body webhook_request)
work=${FUZZ_WORK:-/tmp/steward-fuzz}
cargo +nightly fuzz build -O
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" corpus/$t
  log="$work/$t.log"
  cargo +nightly fuzz run -O "$t" "$work/$t" corpus/$t -- -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1 \
    || { echo "$t: FAILED: a crash or a build error (see $log and fuzz/artifacts/$t)"; exit 1; }
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  echo "$t: ${secs}s, $execs execs, no crash"
  bin=target/x86_64-unknown-linux-gnu/release/$t
  "$bin" -merge=1 corpus/$t "$work/$t" >/dev/null 2>&1
done
