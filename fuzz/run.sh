#!/usr/bin/env bash
# Fuzz flodl-proto's parsers and state machines with atheris (see fuzz/README.md).
#
#   fuzz/run.sh TARGET SECONDS      one target for SECONDS seconds
#   fuzz/run.sh all SECONDS         every target in turn, SECONDS seconds EACH (so the whole run
#                                   takes about SECONDS x the number of targets); exits 1 on any
#                                   finding
#   fuzz/run.sh ci                  every target with a fixed seed and a fixed number of runs
#                                   (deterministic, a few seconds each); exits 1 on any finding
#                                   (its logs: $FLODL_FUZZ_WORK/logs/ci/TARGET.log)
#   fuzz/run.sh minimize TARGET FILE   shrink a finding (writes FILE.min, or, when FILE is not a
#                                   regular file, e.g. a pipe <(...),
#                                   $FLODL_FUZZ_WORK/findings/TARGET/minimized-SHA1; exit 1 when
#                                   FILE does not crash the harness; the driver's output goes to
#                                   $FLODL_FUZZ_WORK/logs/TARGET.minimize.log)
#   fuzz/run.sh replay TARGET FILE...  run inputs through the harness without atheris, under the
#                                   drivers' address-space cap (exit 1 on the first finding: a line
#                                   naming the FILE, then its traceback; 2 when the package's
#                                   dependencies are not installed)
#   fuzz/run.sh list                the targets
#   fuzz/run.sh -h | --help         this text (exit 0)
#
# SECONDS is a whole number of seconds (> 0). Needs atheris: pip install -e '.[fuzz]'. FILEs are
# named from the caller's folder, and each line names one whole, as a shell reads it back. Every
# message starts with `fuzz/run.sh: `, whatever path the script was run by; a usage error's hint
# names the script as it was run (`see ./run.sh --help`).
# Exit codes: 0 no finding, 1 a finding, 2 a usage error, atheris missing (replay: a dependency of
# the package missing), a work folder that cannot be created or written to, 130 interrupted
# (Ctrl-C: `fuzz/run.sh: interrupted`), 143 terminated (SIGTERM: `fuzz/run.sh: terminated`);
# either stops the whole run, every target of `all` and `ci` included, and the first of them
# decides the line and the code; `list` and --help: 1 when stdout cannot be written (one line),
# 141 when its reader went away (quietly).
#
# Environment: PYTHON (interpreter, default python3); FLODL_FUZZ_JOBS (targets run at once by
# `all`, default 1); FLODL_FUZZ_WORK (work folder for grown corpora, logs and findings, default
# fuzz/.work; a relative one is taken from the checkout; the messages name it by absolute path);
# FLODL_FUZZ_CI_RUNS (override the per-target run counts of `ci`); FLODL_FUZZ_ARGS
# (extra libFuzzer flags); FLODL_FUZZ_KILL_AFTER (seconds a stopped driver is given to end after
# its SIGTERM before it is killed, a whole number >= 1, default 10); FLODL_FUZZ_AS_SLACK_MB (MiB
# of address space a driver, or replay, may use beyond its size after start-up, so that an
# allocation sized from a hostile length is a MemoryError finding; a whole number, default 512,
# 0 for no cap).
#
# New inputs a campaign finds go to $FLODL_FUZZ_WORK/corpus/TARGET (the committed seed corpus in
# fuzz/corpus/TARGET is only read); findings go to $FLODL_FUZZ_WORK/findings/TARGET.
set -euo pipefail
CALLER_DIR=$PWD  # replay's and minimize's FILEs are named from the caller's folder
SCRIPT="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"  # for usage, after the cd below
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONHASHSEED=0 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK=${FLODL_FUZZ_WORK:-fuzz/.work}
# by absolute path: the paths the messages name (logs, findings) work from the caller's folder
case "$WORK" in /*) ;; *) WORK="$PWD/${WORK#./}" ;; esac
COMMON=(-dict=fuzz/flodl.dict -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1)
read -r -a EXTRA <<< "${FLODL_FUZZ_ARGS:-}"
KILL_AFTER=${FLODL_FUZZ_KILL_AFTER:-10}
AS_SLACK=${FLODL_FUZZ_AS_SLACK_MB:-512}
PREFIX=()

# Runs per target in `ci` mode: a few seconds each on one core (the stateful targets are slower
# per input). Loading the corpus counts as runs, so each count is well above its corpus size.
declare -A CI_RUNS=(
  [handshake]=4000 [channel_magic]=4000 [round_frame]=2000 [control]=4000 [mux_record]=2000
  [len_framed]=2000 [stream_round_frame]=2000 [stream_len_framed]=2000 [mux_stream]=2000
  [loopback_stream]=2000
  [decode_stream]=2000 [host_fold]=1200 [controller_core]=900 [relay_core]=900
)

# show_help: the comment block at the top of this file, from its second line to its first line
# that is not a comment, on stdout (-h, --help), exit 0; a stdout that cannot be written is one
# line (cannot_write), a reader gone away (`| head -0`) exit 141, quietly
show_help() {
  local text err rc=0
  text=$(awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$SCRIPT")
  exec 3>&1
  err=$( { printf '%s\n' "$text" >&3; } 2>&1 ) || rc=$?
  [ "$rc" -ne 141 ] || exit 141
  [ "$rc" -eq 0 ] || cannot_write "${err##*: }"
  exit 0
}

# cannot_write REASON: stdout cannot be written (`> /dev/full`): one line, exit 1
cannot_write() { echo "fuzz/run.sh: cannot write output: $1" >&2; exit 1; }

# usage_error MESSAGE: a command line the script does not take: one line saying what is wrong and
# where the help is, exit 2. The rule for naming the script: every message starts with the
# script's name, `fuzz/run.sh: `, whatever path it was run by (one prefix to grep for, as the
# docs quote it); a command to run names it as it was run ($0, as a shell reads it back:
# `see ./run.sh --help` from fuzz/, `see /abs/path/fuzz/run.sh --help`)
usage_error() { echo "fuzz/run.sh: $1; see $(pasted "$0") --help" >&2; exit 2; }

# arity MODE WANTED GOT: MODE was given GOT arguments where it takes WANTED
arity() {
  local s=s
  [ "$3" -ne 1 ] || s=
  usage_error "$1 takes $2, got $3 argument$s"
}

# shown TEXT / quoted TEXT: TEXT for a one-line message: as is (quoted: in single quotes) when it
# is plain printable ASCII, else shell-quoted ($'a\nb', $'\342\200\256' for U+202E); over 80
# characters, by its ends and its length. The test and the quoting run in the C locale: in a
# UTF-8 one, [:print:] passes a bidi override or another invisible format character, and %q
# leaves it raw. Every message of this script names a value so, but a path, which `pasted`
# gives whole
shown() {
  local t=$1 n=${#1}  # (characters: counted before the switch to the C locale)
  [ "$n" -le 80 ] || t="${t:0:40}...${t: -20}"
  local LC_ALL=C
  case "$t" in *[![:print:]]*) printf '%q' "$t" ;; *) printf '%s' "$t" ;; esac
  [ "$n" -le 80 ] || printf ' (%d characters)' "$n"
}
quoted() {
  local t=$1 n=${#1}  # (characters: counted before the switch to the C locale)
  [ "$n" -le 80 ] || t="${t:0:40}...${t: -20}"
  local LC_ALL=C
  case "$t" in *[![:print:]]*) printf '%q' "$t" ;; *) printf "'%s'" "$t" ;; esac
  [ "$n" -le 80 ] || printf ' (%d characters)' "$n"
}

# pasted PATH: a path (a log or a findings folder this script makes, a FILE given to minimize or
# replay) as a shell reads it back, so that a printed one can be copied into a shell: as is when
# a shell takes every character of it literally, in single quotes when it is otherwise printable
# ASCII without a quote (a space, `;`, `$`), else as `shown` quotes a name that is not plain
# (`printf %q` in the C locale: $'a\nb', it\'s); never shortened
pasted() {
  local LC_ALL=C
  case "$1" in
    '') printf "''" ;;
    *[!A-Za-z0-9_./:@%+,=-]*)
      case "$1" in *[![:print:]]*|*"'"*) printf '%q' "$1" ;; *) printf "'%s'" "$1" ;; esac ;;
    *) printf '%s' "$1" ;;
  esac
}

# Ctrl-C or SIGTERM: noted here, the first of them in STOP (`interrupted` or `terminated`: the
# word of the script's last line, see `interrupted`); the running target is stopped (see
# `waited`) and no later target starts
INTERRUPTED=0 STOP=
note_stops() {
  trap 'INTERRUPTED=1 STOP=${STOP:-interrupted}' INT
  trap 'INTERRUPTED=1 STOP=${STOP:-terminated}' TERM
}
note_stops

# interrupted: stop every target still running, say so in one line (`fuzz/run.sh: interrupted`
# after Ctrl-C, `fuzz/run.sh: terminated` after SIGTERM: STOP) and exit 130 or 143 (128 + the
# signal's number; no signal noted here, a target's driver ended by one: 130). A target run by
# `all` in the background passes the signal on to its driver and waits for it (see `background`);
# it is signalled again every 0.1 s until it has ended (a signal that comes just before its
# `wait` starts is not acted on), so that no driver runs on after the script. It gets the
# signal of the stop (SIGINT or SIGTERM), so that its summary line says the same word as the
# script's last line, also when it was started just as the stop came (too late to get it)
BACKGROUND=()
interrupted() {
  local pid i sig=INT
  [ "$STOP" != terminated ] || sig=TERM
  for pid in ${BACKGROUND[@]+"${BACKGROUND[@]}"}; do
    for i in $(seq 600); do
      kill -"$sig" "$pid" 2>/dev/null || break
      sleep 0.1
    done
  done
  wait || true
  if [ "$STOP" = terminated ]; then
    echo "fuzz/run.sh: terminated" >&2
    exit 143
  fi
  echo "fuzz/run.sh: interrupted" >&2
  exit 130
}

# waited CMD...: run CMD and return its exit code. It runs in the background and is waited for,
# so a signal to this script alone (`kill PID`) is acted on at once: bash runs a trap only after
# a foreground child returns, while `wait` returns when a trapped signal arrives; the signal is
# then passed on to CMD (a background command ignores Ctrl-C's SIGINT: it gets SIGTERM)
waited() {
  local pid rc=0 watchdog=
  "$@" &
  pid=$!
  # (a signal that came before the fork is passed on below at once)
  [ "$INTERRUPTED" -eq 1 ] || wait "$pid" || rc=$?
  while kill -0 "$pid" 2>/dev/null; do
    kill -TERM "$pid" 2>/dev/null || true
    # a driver still there KILL_AFTER s (FLODL_FUZZ_KILL_AFTER, default 10) after the first
    # SIGTERM is killed: a driver has been seen to run on for hours after a SIGTERM during its
    # start (cause not established; libFuzzer's SIGTERM handler prints, which a signal handler
    # cannot do safely, is one candidate)
    if [ -z "$watchdog" ]; then
      (sleep "$KILL_AFTER"; kill -KILL "$pid" 2>/dev/null) > /dev/null 2>&1 < /dev/null &
      watchdog=$!
    fi
    rc=0; wait "$pid" || rc=$?
  done
  [ -z "$watchdog" ] || kill "$watchdog" 2>/dev/null || true
  return "$rc"
}

# caller_path FILE: FILE named from the caller's folder
caller_path() {
  case "$1" in /*) echo "$1" ;; *) echo "$CALLER_DIR/$1" ;; esac
}

# read_error PATH: why PATH cannot be read, in the system's words, as replay's reader says it
# ("No such file or directory", "Is a directory", "Permission denied"), or nothing. PATH is
# opened without waiting for a writer (a FIFO is read later, as replay reads it). The
# interpreter dies of a Ctrl-C at its default, without a KeyboardInterrupt traceback (the caller
# checks INTERRUPTED)
read_error() {
  "$PY" - "$1" <<'EOF'
import errno, os, signal, stat, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
except OSError as e:
    print(e.strerror)
else:
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        print(os.strerror(errno.EISDIR))  # what reading it says
    os.close(fd)
EOF
}

# seconds N: N must be a whole number of seconds > 0
seconds() {
  case "$1" in
    ''|*[!0-9]*) echo "fuzz/run.sh: SECONDS must be a whole number of seconds, got $(quoted "$1")" >&2; exit 2 ;;
  esac
  # at most 9 digits (about 31 years): bash's test compares 64-bit numbers only
  [ "${#1}" -le 9 ] || { echo "fuzz/run.sh: SECONDS must be at most 999999999, got $(quoted "$1")" >&2; exit 2; }
  [ "$((10#$1))" -gt 0 ] || { echo "fuzz/run.sh: SECONDS must be > 0, got $(quoted "$1")" >&2; exit 2; }
}

# need_atheris: the fuzzing modes need atheris (the fuzz extra); say so in one line
need_atheris() {
  local found
  # in a command substitution whose shell's stderr is /dev/null: an interpreter killed by a
  # SIGTERM to the process group, in the foreground, is reported by the shell ("Terminated")
  found=$(exec 2>/dev/null; "$PY" -c 'import atheris' >/dev/null && echo yes) || true
  [ "$found" = yes ] || {
    [ "$INTERRUPTED" -eq 0 ] || interrupted  # Ctrl-C during the check: no verdict on atheris
    echo "fuzz/run.sh: atheris is not installed for $(pasted "$PY"): install the fuzz extra (pip install -e '.[fuzz]')" >&2
    exit 2
  }
}

# check_work: the work folder can be created and written to; else one line naming it and the
# system's reason, exit 2, before any target runs (a file in its place made each target's log
# unwritable and its run a FINDING with nothing run)
check_work() {
  local why
  why=$("$PY" - "$WORK" <<'EOF'
import os, signal, sys, tempfile
signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C: no traceback (INTERRUPTED is checked)
try:
    os.makedirs(sys.argv[1], exist_ok=True)
    fd, name = tempfile.mkstemp(dir=sys.argv[1])
    os.close(fd)
    os.unlink(name)
except OSError as e:
    print(e.strerror)
EOF
  ) || true
  [ "$INTERRUPTED" -eq 0 ] || interrupted
  [ -z "$why" ] || {
    echo "fuzz/run.sh: the work folder $(pasted "$WORK") cannot be used: $why" >&2; exit 2
  }
}

# targets: the target names, one line. A Ctrl-C while they are listed leaves the list empty (a
# subshell has not this shell's trap): every caller checks INTERRUPTED after reading it. The
# interpreter dies of the Ctrl-C at its default, without a KeyboardInterrupt traceback
# (`list` prints them: a reader gone away ends the interpreter by SIGPIPE, quietly, exit 141; a
# stdout that cannot be written is one line, as cannot_write says it, exit 1)
targets() {
  "$PY" -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
from fuzz.harnesses import TARGETS
try:
    print(" ".join(TARGETS), flush=True)
except OSError as e:
    print(f"fuzz/run.sh: cannot write output: {e.strerror}", file=sys.stderr, flush=True)
    os._exit(1)  # not again at exit: the text is still in the buffer'
}

is_target() {
  local t
  for t in $(targets); do [ "$t" = "$1" ] && return 0; done
  [ "$INTERRUPTED" -eq 0 ] || interrupted
  return 1
}

# summary TARGET LOG RC: one line with runs, exec/s, coverage and the result
summary() {
  local target=$1 log=$2 rc=$3 runs eps cov ft rss slow result artifact
  runs=$(stat_of number_of_executed_units "$log")
  eps=$(stat_of average_exec_per_sec "$log")
  # libFuzzer divides by whole seconds elapsed: a run of under a second says 0
  if [ "${eps:-}" = 0 ] && [ "${runs:-0}" -gt 0 ]; then eps=">$runs"; fi
  rss=$(stat_of peak_rss_mb "$log")
  slow=$(stat_of slowest_unit_time_sec "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  artifact=$(grep -o "Test unit written to .*" "$log" | tail -1 | sed 's/.* written to //' || true)
  if [ "$rc" -eq 0 ]; then result=ok
  elif [ "$rc" -eq 130 ] || [ "$INTERRUPTED" -eq 1 ]; then result=${STOP:-interrupted}
  else result="FINDING (exit $rc${artifact:+, $(pasted "$artifact")})"; fi
  printf '%-19s runs=%-8s exec/s=%-6s cov=%-5s ft=%-6s rss=%-5s slowest=%-3s %s\n' "$target" \
    "${runs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${rss:-?}MB" "${slow:-?}s" "$result"
}

# stat_of NAME LOG: a libFuzzer final statistic (-print_final_stats=1)
stat_of() {
  grep -o "stat::$1: *[0-9]*" "$2" | tail -1 | grep -o '[0-9]*$' || true
}

# fuzz_one TARGET LOG ARTIFACT_DIR OUT_CORPUS [libFuzzer flags...]: 0 no finding, 1 a finding,
# 130 stopped (Ctrl-C or SIGTERM: the caller ends the run with `interrupted`, which says which)
fuzz_one() {
  local target=$1 log=$2 artifacts=$3 out=$4 rc=0
  shift 4
  mkdir -p "$artifacts" "$out" "$(dirname "$log")"
  waited ${PREFIX[@]+"${PREFIX[@]}"} "$PY" fuzz/driver.py "$target" "$out" \
    "fuzz/corpus/$target" "${COMMON[@]}" -artifact_prefix="$artifacts/" "$@" \
    ${EXTRA[@]+"${EXTRA[@]}"} > "$log" 2>&1 || rc=$?
  summary "$target" "$log" "$rc"
  if [ "$rc" -eq 130 ] || [ "$INTERRUPTED" -eq 1 ]; then
    return 130
  elif [ "$rc" -ne 0 ]; then
    echo "fuzz/run.sh: $target: last lines of $(pasted "$log"):" >&2
    grep -v '^INFO: Instrumenting' "$log" | tail -25 >&2
    return 1
  fi
}

# background TARGET SECONDS: `timed`, run by `all` in the background. A subshell does not keep
# this shell's traps (Ctrl-C's SIGINT killed it, leaving its driver running): it sets its own, so
# that `waited` passes a signal on to the driver and waits until the driver has ended (its
# summary line says the word of the stop: see `interrupted`)
background() {
  note_stops
  timed "$@"
}

timed() {
  local target=$1 seconds=$2
  fuzz_one "$target" "$WORK/logs/$target.log" "$WORK/findings/$target" "$WORK/corpus/$target" \
    -max_total_time="$seconds"
}

# check_jobs: FLODL_FUZZ_JOBS is a whole number >= 1 (a usage error otherwise)
check_jobs() {
  local jobs=${FLODL_FUZZ_JOBS:-1}
  case "$jobs" in
    ''|*[!0-9]*) ;;
    *) [ "$((10#$jobs))" -lt 1 ] || return 0 ;;
  esac
  echo "fuzz/run.sh: FLODL_FUZZ_JOBS must be a whole number >= 1, got $(quoted "$jobs")" >&2
  exit 2
}

run_all() {
  local seconds=$1 jobs=$((10#${FLODL_FUZZ_JOBS:-1})) failed=0 t pid rc
  for t in $(targets); do
    [ "$INTERRUPTED" -eq 0 ] || interrupted
    if [ "$jobs" -le 1 ]; then
      rc=0; timed "$t" "$seconds" || rc=$?
      [ "$rc" -ne 130 ] || interrupted
      [ "$rc" -eq 0 ] || failed=1
    else
      background "$t" "$seconds" &
      BACKGROUND+=($!)
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
        rc=0; wait -n || rc=$?
        [ "$rc" -ne 130 ] && [ "$INTERRUPTED" -eq 0 ] || interrupted
        [ "$rc" -eq 0 ] || failed=1
      done
    fi
  done
  [ "$INTERRUPTED" -eq 0 ] || interrupted
  for pid in ${BACKGROUND[@]+"${BACKGROUND[@]}"}; do
    rc=0; wait "$pid" || rc=$?
    [ "$rc" -ne 130 ] && [ "$INTERRUPTED" -eq 0 ] || interrupted
    [ "$rc" -eq 0 ] || failed=1
  done
  [ "$failed" -eq 0 ] || {
    echo "fuzz/run.sh: findings (see $(pasted "$WORK/findings"))" >&2; exit 1
  }
}

# check_kill_after: FLODL_FUZZ_KILL_AFTER, when set, is a whole number of seconds >= 1 (at most
# 9 digits, as SECONDS); checked before any driver runs, by every mode that runs one
check_kill_after() {
  case "$KILL_AFTER" in
    *[!0-9]*|''|0|00*|??????????*)
      echo "fuzz/run.sh: FLODL_FUZZ_KILL_AFTER must be a whole number of seconds from 1 to" \
        "999999999, got $(quoted "$KILL_AFTER")" >&2; exit 2 ;;
  esac
}

# check_as_slack: FLODL_FUZZ_AS_SLACK_MB, when set, is a whole number of MiB >= 0 (0 lifts the
# address-space cap; at most 9 digits); the drivers and replay read it, so every mode that runs
# one checks it first (a driver that failed to read it was reported as a finding)
check_as_slack() {
  case "$AS_SLACK" in
    *[!0-9]*|''|??????????*)
      echo "fuzz/run.sh: FLODL_FUZZ_AS_SLACK_MB must be a whole number of MiB from 0 to" \
        "999999999, got $(quoted "$AS_SLACK")" >&2; exit 2 ;;
  esac
}

# check_ci_runs: FLODL_FUZZ_CI_RUNS, when set, is a whole number >= 1 (libFuzzer reads anything
# else as no limit or no run, and `ci` then passed having fuzzed nothing)
check_ci_runs() {
  case "${FLODL_FUZZ_CI_RUNS:-1}" in
    *[!0-9]*|0|00*) echo "fuzz/run.sh: FLODL_FUZZ_CI_RUNS must be a whole number >= 1, got" \
                      "$(quoted "$FLODL_FUZZ_CI_RUNS")" >&2; exit 2 ;;
  esac
}

run_ci() {
  local failed=0 t runs rc
  CI_TMP=$(mktemp -d)
  trap 'rm -rf "$CI_TMP"' EXIT
  local tmp=$CI_TMP
  # atheris derives comparison-table slots from code addresses, so address-space randomization
  # changes which mutations a seed produces: switch it off for a reproducible run where allowed
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    PREFIX=(setarch "$(uname -m)" -R)
  else
    echo "fuzz/run.sh: ci: setarch -R unavailable; runs may explore differently between machines" >&2
  fi
  for t in $(targets); do
    runs=${FLODL_FUZZ_CI_RUNS:-${CI_RUNS[$t]:-2000}}
    rc=0
    # the log and a finding go to the work folder, where the lines that name them point (the
    # temporary folder, which keeps the run's new inputs only, is removed on exit); a target's
    # findings folder is left only when it failed or holds something
    fuzz_one "$t" "$WORK/logs/ci/$t.log" "$WORK/findings/ci/$t" "$tmp/corpus/$t" -seed=1 \
      -runs="$runs" -reload=0 || rc=$?
    [ "$rc" -ne 0 ] || rmdir "$WORK/findings/ci/$t" 2>/dev/null || true
    [ "$rc" -ne 130 ] || interrupted
    [ "$rc" -eq 0 ] || failed=1
  done
  [ "$failed" -ne 0 ] || { rmdir "$WORK/findings/ci" && rmdir "$WORK/findings"; } 2>/dev/null || true
  [ "$INTERRUPTED" -eq 0 ] || interrupted
  [ "$failed" -eq 0 ] || {
    echo "fuzz/run.sh: ci: findings in $(pasted "$WORK/findings/ci")" >&2; exit 1
  }
}

[ $# -ge 1 ] || usage_error "no mode given (a target, all, ci, minimize, replay or list)"
case "$1" in
  -h|--help) show_help ;;
  list)
    [ $# -eq 1 ] || arity list "no arguments" $(($# - 1))
    # in the background and waited for: the shell reports a foreground command killed by a
    # SIGTERM to the process group ("Terminated"); `targets` dies of Ctrl-C's SIGINT all the same
    rc=0; targets & wait "$!" || rc=$?
    [ "$INTERRUPTED" -eq 0 ] || interrupted
    exit "$rc"
    ;;
  ci) [ $# -eq 1 ] || arity ci "no arguments" $(($# - 1)); check_ci_runs; check_kill_after; check_as_slack; need_atheris; check_work; run_ci ;;
  all) [ $# -eq 2 ] || arity all SECONDS $(($# - 1)); seconds "$2"; check_jobs; check_kill_after; check_as_slack; need_atheris; check_work; run_all "$2" ;;
  minimize)
    [ $# -eq 3 ] || arity minimize "TARGET FILE" $(($# - 1))
    check_kill_after
    check_as_slack
    is_target "$2" || { echo "fuzz/run.sh: unknown target $(shown "$2"); targets: $(targets)" >&2; exit 2; }
    file=$(caller_path "$3")
    why=$(read_error "$file") || true
    [ "$INTERRUPTED" -eq 0 ] || interrupted
    [ -z "$why" ] || { echo "fuzz/run.sh: minimize: cannot read $(pasted "$3"): $why" >&2; exit 2; }
    need_atheris
    check_work
    # the result goes next to FILE, as FILE.min; a FILE that is no regular file in a folder one
    # can write to (a pipe such as <(...), a device, a file under /dev or /proc) has no such
    # place: the result goes to the work folder's findings, named by its SHA-1 (as libFuzzer
    # names its artifacts), printed in full
    out= elsewhere="$(pasted "$3") is not a regular file"
    case "$file" in
      /dev/*|/proc/*) ;;
      *)
        if [ ! -f "$file" ]; then :
        elif [ -w "$(dirname "$file")" ]; then out=$file.min; rm -f "$out"
        else elsewhere="the folder of $(pasted "$3") cannot be written to"
        fi ;;
    esac
    # the driver's output (atheris' INFO lines, libFuzzer's CRASH_MIN passes) goes to a log,
    # named by absolute path: the caller may be in another folder
    mkdir -p "$WORK/logs"
    log="$(cd "$WORK/logs" && pwd)/$2.minimize.log"
    # libFuzzer's minimize runs itself again through `sh -c` with the input's and the result's
    # paths pasted into the command line: a name with a space failed, one with `;` ran as a
    # command. The driver gets a copy under a name of plain characters; the result is copied back
    base=${TMPDIR:-/tmp}
    case "$base" in *[!A-Za-z0-9_./-]*|'') base=/tmp ;; esac
    MIN_TMP=$(mktemp -d "$base/flodl-minimize.XXXXXX")
    trap 'rm -rf "$MIN_TMP"' EXIT
    cp "$file" "$MIN_TMP/input"
    rc=0
    waited "$PY" fuzz/driver.py "$2" -minimize_crash=1 -runs=20000 \
      -exact_artifact_path="$MIN_TMP/input.min" "${COMMON[@]}" "$MIN_TMP/input" > "$log" 2>&1 \
      || rc=$?
    [ "$INTERRUPTED" -eq 0 ] && [ "$rc" -ne 130 ] || interrupted
    if [ -s "$MIN_TMP/input.min" ]; then
      if [ -n "$out" ]; then
        where=$(pasted "$3.min") elsewhere=
      else
        mkdir -p "$WORK/findings/$2"
        out="$(cd "$WORK/findings/$2" && pwd)/minimized-$(sha1sum < "$MIN_TMP/input.min" |
          cut -c1-40)"
        where=$(pasted "$out") elsewhere="; $elsewhere"
      fi
      cp "$MIN_TMP/input.min" "$out"
      echo "fuzz/run.sh: minimize: wrote $where ($(wc -c < "$out") bytes$elsewhere; driver" \
        "log $(pasted "$log"))"
    elif grep -q '^ERROR: the input .* did not crash$' "$log"; then
      echo "fuzz/run.sh: minimize: $(pasted "$3") does not crash the $2 harness: nothing to minimize" \
        "(driver log $(pasted "$log"))" >&2
      exit 1
    else
      echo "fuzz/run.sh: minimize: $(pasted "$3"): no minimized input written (driver exit $rc); last" \
        "lines of $(pasted "$log"):" >&2
      grep -v '^INFO: Instrumenting' "$log" | tail -25 >&2
      exit 1
    fi
    ;;
  replay)
    [ $# -ge 3 ] || arity replay "TARGET FILE..." $(($# - 1))
    check_kill_after
    check_as_slack
    is_target "$2" || { echo "fuzz/run.sh: unknown target $(shown "$2"); targets: $(targets)" >&2; exit 2; }
    target=$2
    shift 2
    # each FILE, then each FILE as `pasted` gives it (whole, quoted for a shell where it needs
    # to be): the Python part prints the names it is given, so a finding's path can be copied
    names=()
    for f in "$@"; do names+=("$(pasted "$f")"); done
    # run by `waited` (in the background, with SIGINT ignored, as a fuzzing driver): a Ctrl-C or
    # SIGTERM ends it by the SIGTERM passed on, without a KeyboardInterrupt traceback or the
    # shell's "Terminated", and the script says which stop it was
    IFS= read -r -d '' replay_py <<'EOF' || true
import importlib, logging, os, sys, traceback
logging.disable(logging.CRITICAL)
caller, target, python, *rest = sys.argv[1:]
files, names = rest[:len(rest) // 2], rest[len(rest) // 2:]
try:  # first: without the package's dependencies (numpy ...) nothing can run; a usage error
    mod = importlib.import_module(f"fuzz.harnesses.{target}")
except ModuleNotFoundError as e:
    if e.name is None or e.name.split(".")[0] in ("flodl_proto", "fuzz"):
        raise  # a module of this checkout: a bug, its traceback
    print(f"fuzz/run.sh: replay: {e.name} is not installed for {python}: install the package "
          "with its extras (pip install -e '.[test,fuzz]')", file=sys.stderr)
    sys.exit(2)
inputs = []
for f, name in zip(files, names):  # every FILE is read before any runs: one that cannot be
    try:                           # read is a usage error, exit 2
        with open(os.path.join(caller, f), "rb") as fh:
            inputs.append((name, fh.read()))
    except OSError as e:  # the system's words, as read_error gives them to minimize
        print(f"fuzz/run.sh: replay: cannot read {name}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
from fuzz.driver import limit_address_space  # the drivers' cap: a memory finding reproduces
limit_address_space()
for name, data in inputs:
    try:
        mod.test_one_input(data)
    except Exception:  # a finding: a line naming the file, then the harness's traceback, exit 1
        sys.stdout.flush()
        print(f"fuzz/run.sh: replay: {name}: finding: the {target} harness raised", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    print(f"{name}: ok")
EOF
    rc=0
    waited "$PY" -c "$replay_py" "$CALLER_DIR" "$target" "$(pasted "$PY")" "$@" "${names[@]}" \
      || rc=$?
    [ "$INTERRUPTED" -eq 0 ] || interrupted
    exit "$rc"
    ;;
  *)
    case "$1" in -*) usage_error "unknown option $(shown "$1")" ;; esac
    if [ $# -ne 2 ]; then
      is_target "$1" ||
        usage_error "unknown mode or target $(shown "$1"); modes: all ci minimize replay list; targets: $(targets)"
      arity "$1" SECONDS $(($# - 1))
    fi
    is_target "$1" || { echo "fuzz/run.sh: unknown target $(shown "$1"); targets: $(targets)" >&2; exit 2; }
    seconds "$2"
    check_kill_after
    check_as_slack
    need_atheris
    check_work
    rc=0; timed "$1" "$2" || rc=$?
    [ "$rc" -ne 130 ] || interrupted
    exit "$rc"
    ;;
esac
