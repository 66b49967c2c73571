#!/usr/bin/env bash
# scripts/run_resumable.sh against a real doctest executable (tests/resume_fixture.cpp): a case
# that crashes and a case that meets a sticky CUDA error are each named, and the cases after them
# run in a new process and pass; nothing is resumed when nothing broke, nor past MG_RESUME_MOST.
set -uo pipefail
fixture=$1
source "$(dirname "$0")/../scripts/run_resumable.sh"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail=0
expect() {  # WHAT CONDITION...
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what"
    sed 's/^/  | /' "$log"
    fail=1
  fi
}
passed() { grep -c "^\[doctest\] Status: SUCCESS" "$log"; }

# Nothing broken: one part, exit 0, no resumption.
run_resumable 60 "$log" "$fixture"
rc=$?
expect "a clean run exits 0 ($rc)" [ $rc -eq 0 ]
expect "a clean run is not resumed" [ "$(grep -c '^\[run_resumable\]' "$log")" -eq 0 ]

# Case 2 crashes, case 3 poisons the process: three parts, the last one passes cases 4 and 5. The
# crash's status is the executable's own (139 for SIGSEGV; 1 under AddressSanitizer, which takes
# the signal doctest raises again).
MG_FIXTURE_CRASH=1 "$fixture" >/dev/null 2>&1
crash_rc=$?
MG_FIXTURE_CRASH=1 MG_FIXTURE_STICKY=1 run_resumable 60 "$log" "$fixture"
rc=$?
expect "the fixture's crash exits non-zero" [ $crash_rc -ne 0 ]
expect "the crash's status is returned ($crash_rc, got $rc)" [ $rc -eq $crash_rc ]
expect "case 2 is named as crashed" grep -q "^\[run_resumable\] resume_fixture: case 2 (fixture 2: crashes when asked) crashed (exit $crash_rc); resumed from case 3\$" "$log"
expect "case 3 is named for its sticky error" grep -q '^\[run_resumable\] resume_fixture: case 3 (fixture 3: meets a sticky error when asked) met a sticky CUDA error; resumed from case 4$' "$log"
expect "cases 3, 4 and 5 threw in the poisoned part" [ "$(grep -c 'test case THREW exception' "$log")" -eq 3 ]
expect "the last part passes cases 4 and 5" [ "$(passed)" -eq 1 ]
expect "cases 4 and 5 ended in the last part" [ "$(tail -n 12 "$log" | grep -cE '^[0-9.]+ s: fixture [45]')" -eq 2 ]

# Filters pass through: with case 1 filtered out, the crashing case is the first one.
MG_FIXTURE_CRASH=1 run_resumable 60 "$log" "$fixture" -tce="fixture 1*"
expect "indices count the filtered cases" grep -q 'case 1 (fixture 2: crashes when asked) crashed' "$log"
expect "the rest pass after the crash" [ "$(passed)" -eq 1 ]

# A crash after the last case, outside any: not resumed (it would blame an innocent case), and
# named where the exit shows the signal (under AddressSanitizer it is a plain exit 1).
MG_FIXTURE_TEARDOWN=1 run_resumable 60 "$log" "$fixture"
rc=$?
expect "a crash outside any case is not resumed" [ "$(grep -c 'resumed from' "$log")" -eq 0 ]
if [ $rc -gt 128 ]; then
  expect "a crash outside any case is named" grep -q "exit $rc after case 5, outside any case; not resumed" "$log"
fi

# At most MG_RESUME_MOST resumptions.
MG_RESUME_MOST=1 MG_FIXTURE_CRASH=1 MG_FIXTURE_STICKY=1 run_resumable 60 "$log" "$fixture"
expect "one resumption only" [ "$(grep -c '^\[run_resumable\]' "$log")" -eq 1 ]

# Behind a wrapper (as compute-sanitizer runs it), with the executable's own arguments after it.
MG_FIXTURE_CRASH=1 run_resumable 60 "$log" env MG_UNUSED=1 "$fixture" -tce="fixture 1*"
expect "a wrapped executable is named and listed" grep -q 'resume_fixture: case 1 (fixture 2: crashes when asked) crashed' "$log"
expect "a wrapped executable is resumed" [ "$(passed)" -eq 1 ]

exit $fail
