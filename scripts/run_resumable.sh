# Sourced, not run: run_resumable, which runs a doctest executable so that one case that kills its
# process does not cost the cases after it (scripts/gpu_verify.sh's quick and test stages).
#
# On a GPU lease every GPU test has run only compiled: a case that crashes (a signal: SIGSEGV,
# an abort) ends its executable, and a case that meets a sticky CUDA error (an illegal address,
# a launch failure; every later CUDA call in the process then fails too) makes every later case
# fail for it. Either way the cases after it would say nothing, and finding out what they say would
# take another call of the lease. So, within the same time limit, the executable is started again
# from the case after the one that broke it (doctest's --first counts the cases that pass the
# filters, in the order they run), at most MG_RESUME_MOST times (default 8).
#
#   run_resumable LIMIT LOG COMMAND...
#
# runs `COMMAND --duration=true --first=K` under `timeout`, all parts together within LIMIT
# seconds, into LOG (each later part appended after a line "[run_resumable] ..."). COMMAND is a
# doctest executable and its arguments, possibly behind a wrapper (compute-sanitizer ... EXE ...):
# EXE is the last of its words that names an executable file. Returns the first part's exit
# status that was not 0 (a crash counts as its signal's, 128 + n), or 0. For each case that broke
# a part it appends a line to LOG and prints it:
#   [run_resumable] EXE: case K (NAME) crashed (exit C); resumed from case K+1
#   [run_resumable] EXE: case K (NAME) met a sticky CUDA error; resumed from case K+1
# A timeout is not resumed: the limit is spent.

# cudaGetErrorString's texts for the errors that stay with a CUDA context once they happen.
mg_sticky_cuda_errors='an illegal memory access was encountered|unspecified launch failure|misaligned address|an illegal instruction was encountered|device-side assert triggered|invalid program counter|operation not supported on global/shared address space|the launch timed out and was terminated|uncorrectable ECC error encountered'

# The index within a part's log of the case that broke it, and how: the case during which doctest
# reported a crash ("test case CRASHED", before that case's end: "crashed"), or a sticky error's
# text first appeared ("sticky"); doctest prints "<seconds> s: <name>" as each case ends, with
# --duration. For a process killed without doctest's report, the case after the last one that
# ended ("crashed"). "0 -" when none of these.
mg_broken_case() {  # LOG_PART SIGNALLED(0|1)
  awk -v signalled="$2" -v sticky="$mg_sticky_cuda_errors" '
    /^=========/ { next }  # compute-sanitizer: its own process, whose lines may come before the test'"'"'s
    /^[0-9]+\.[0-9]+ s: / { ended++; next }
    /test case CRASHED/ { print ended + 1, "crashed"; found = 1; exit }
    $0 ~ sticky { print ended + 1, "sticky"; found = 1; exit }
    END { if (!found) print (signalled ? ended + 1 " crashed" : "0 -") }' "$1"
}

run_resumable() {
  local limit=$1 log=$2
  shift 2
  local deadline=$((SECONDS + limit)) first=1 part rc status=0 k how name resumes=0 signalled why
  local exe_at=0 i
  for ((i = 1; i <= $#; i++)); do [ -f "${!i}" ] && [ -x "${!i}" ] && exe_at=$i; done
  [ "$exe_at" -gt 0 ] || exe_at=1  # none is a file here (found on PATH): the first word
  local exe=${!exe_at}
  part=$(mktemp)
  : >"$log"
  while :; do
    timeout "$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))" "$@" --duration=true "--first=$first" >"$part" 2>&1
    rc=$?
    cat "$part" >>"$log"
    [ $status -eq 0 ] && status=$rc
    signalled=0
    [ $rc -gt 128 ] && signalled=1  # killed by a signal (timeout's own 124 is not resumed)
    k=0 how=-
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && read -r k how < <(mg_broken_case "$part" $signalled)
    if [ "$k" -eq 0 ] || [ $resumes -ge "${MG_RESUME_MOST:-8}" ] || [ $SECONDS -ge $deadline ]; then
      break
    fi
    k=$((first + k - 1))  # the index among all the cases that pass the filters
    name=$("${@:exe_at}" --list-test-cases 2>/dev/null | sed -n '/^===/,/^===/p' | grep -v '^===' | sed -n "${k}p")
    if [ -z "$name" ]; then  # past the last case: it broke outside any (start-up, teardown)
      echo "[run_resumable] $(basename "$exe"): exit $rc after case $((k - 1)), outside any case; not resumed" | tee -a "$log"
      break
    fi
    why="met a sticky CUDA error"
    [ "$how" = crashed ] && why="crashed (exit $rc)"
    echo "[run_resumable] $(basename "$exe"): case $k ($name) $why; resumed from case $((k + 1))" | tee -a "$log"
    first=$((k + 1))
    resumes=$((resumes + 1))
  done
  rm -f "$part"
  return $status
}
