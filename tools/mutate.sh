#!/usr/bin/env bash
# Mutation testing of one package (or all of them) with mutmut, against that package's own unit and
# property tests (never the golden vectors). `decode` is the capture-decoding path, not a
# package directory: flodl_proto/decode.py and flodl_proto/pcap.py against tests/test_decode*.py
# and tests/test_pcap*.py.
#
#   tools/mutate.sh codec|reduce|fsm|decode|all [--files a.py,b.py] [--tests "a b"] [--mutants "m ..."] [--keep]
#   tools/mutate.sh sample
#
# The checkout (tracked and untracked, not ignored files) is copied to a temporary directory, the
# package's [tool.mutmut] section is appended to the copy's pyproject.toml, and mutmut runs there
# under `nice -n 10` with at most 2 worker processes. It prints mutmut's summary and the surviving
# mutants (`mutmut results`); docs/testing.md records the judged survivors.
#
# --files: mutate only these modules of the package (names relative to flodl_proto/<package>/,
# or a module the package takes along, e.g. membership.py for fsm, pcap.py for decode), e.g. to
# run a package module
# by module on a busy machine.
# --tests: run this narrower selection of the package's tests (space-separated paths) instead.
# --mutants: run only these mutants (space-separated names or fnmatch patterns, as `mutmut
# results` prints them), e.g. to re-run the survivors of a run after adding tests.
# --keep: keep the temporary directory (its path is printed).
# sample: the fixed small sample CI runs (a minute or two, so the habit does not rot): the
# mutants of the tag functions of flodl_proto/codec/auth.py (compute_tag, tags_equal, tag_as_u64,
# new_mac) against tests/test_codec_auth.py; exit status 1 when one survives that is not listed
# in tools/mutants-equivalent.txt (mutants judged equivalent, each with its reason).
# Ctrl-C stops the run (exit 130), SIGTERM too (143), to the script alone or to its group: the
# mutmut run is stopped and the temporary copy removed (unless --keep).
#
# Environment: PYTHON (default .venv/bin/python, then python3) must have mutmut installed (the
# `test` extra).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
PY="$(command -v "$PY")"
case "$PY" in
    /*) ;;
    *) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;  # the runs cd into a copy
esac

usage() {
    echo "usage: tools/mutate.sh codec|reduce|fsm|decode|all [--files a.py,b.py] [--tests \"a b\"] [--mutants \"m ...\"] [--keep]"
    echo "       tools/mutate.sh sample"
}
pkg="${1:-}"
case "$pkg" in
    -h|--help) usage; exit 0 ;;
    "") echo "mutate.sh: no package given" >&2; usage >&2; exit 2 ;;
esac
shift || true
files=""
only_tests=""
mutants=""
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --files|--tests|--mutants)
            if [ $# -lt 2 ] || [ -z "$2" ]; then
                echo "mutate.sh: $1 needs a value" >&2; usage >&2; exit 2
            fi
            case "$1" in
                --files) files="$2" ;;
                --tests) only_tests="$2" ;;
                *) mutants="$2" ;;
            esac
            shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "mutate.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# the temporary copy of the run in progress: removed on every exit (Ctrl-C and kill included)
# unless --keep
work=""
# the mutmut run in progress: a process group of its own (its workers and their tests with it),
# stopped as a whole on Ctrl-C or SIGTERM, whether the signal came to the script's group or to
# the script alone (bash acts on a trap only after a foreground child returns, so mutmut runs in
# the background and is waited for)
child=""
cleanup() {
    if [ -n "$child" ]; then
        kill -TERM -- "-$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    if [ -n "$work" ] && [ $keep -eq 0 ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# copy_checkout DEST: the checkout's tracked and untracked files (not the ignored ones), without
# any virtual environment in it (a folder holding pyvenv.cfg: hundreds of MB)
copy_checkout() {
    local d skip=""
    for d in "$ROOT"/*/ "$ROOT"/.[!.]*/; do
        [ -f "$d/pyvenv.cfg" ] || continue
        d="$(printf '%s' "${d#"$ROOT"/}" | sed 's/[][\.*^$()+?{}|]/\\&/g')"
        skip="${skip:+$skip|}$d"
    done
    (cd "$ROOT" && git ls-files -co --exclude-standard -z \
        | { if [ -z "$skip" ]; then cat; else grep -z -v -E "^($skip)" || true; fi; } \
        | tar --null -T - -cf -) | tar -xf - -C "$1"
}

tests_for() {
    case "$1" in
        codec) echo "$(cd "$ROOT" && ls tests/test_codec*.py | tr '\n' ' ')tests/test_mux_stream.py tests/test_hot_path.py tests/test_stream_stateful.py" ;;
        reduce) echo "tests/test_reduce.py tests/test_reduce_errors.py tests/test_outer.py tests/test_scale_payload.py tests/test_scale_to_bf16.py tests/test_host_fold_edges.py tests/test_hot_path.py tests/test_kernels.py tests/test_bf16.py tests/test_bf16_rounding.py tests/test_fold_reuse.py tests/test_reduce_units.py tests/test_host_fold_stateful.py tests/test_small_batch.py tests/test_relay_small_path.py" ;;
        fsm) echo "tests/test_controller_core.py tests/test_core_deadlines.py tests/test_lifecycle.py tests/test_membership.py $(cd "$ROOT" && ls tests/test_relay_core*.py 2>/dev/null | tr '\n' ' ')" ;;
        decode) echo "$(cd "$ROOT" && ls tests/test_decode*.py tests/test_pcap*.py 2>/dev/null | tr '\n' ' ')" ;;
        sample) echo "tests/test_codec_auth.py" ;;
        *) return 1 ;;
    esac
}

# modules outside flodl_proto/<package>/ mutated with a package (names relative to flodl_proto/):
# the dead-rank ledger the controller core keeps; decode is made of two top-level modules only
extra_modules_for() {
    case "$1" in
        fsm) echo "membership.py" ;;
        decode) echo "decode.py pcap.py" ;;
        *) echo "" ;;
    esac
}

# long state machines left out of the per-mutant runs (each would add 15-20 s of CPU to every
# surviving mutant of its package); the unit tests of the same modules run instead
deselected_for() {
    case "$1" in
        fsm) echo "tests/test_lifecycle.py::TestLifecycleStateful::runTest tests/test_controller_core.py::test_controller_core_state_machine tests/test_relay_core.py::test_relay_core_state_machine" ;;
        reduce) echo "tests/test_host_fold_stateful.py::test_host_fold_state_machine" ;;
        codec) echo "tests/test_stream_stateful.py::TestStreamSplitStateful::runTest" ;;
        # the command line in child processes, checking memory use (1-7 s each, no decoding
        # logic of their own: the other tests decode the same kinds of input in process)
        decode) echo "tests/test_decode.py::test_a_long_stream_is_decoded_in_flat_memory tests/test_decode.py::test_a_file_is_held_once_in_memory tests/test_decode.py::test_an_input_larger_than_memory_is_one_error_line" ;;
        *) echo "" ;;
    esac
}

run_one() {
    local p="$1" tests only=() f  # work: the global the EXIT trap removes
    tests="$(tests_for "$p")" || { echo "mutate.sh: unknown package '$p'" >&2; usage >&2; exit 2; }
    if [ -n "$only_tests" ]; then tests="$only_tests"; fi
    if [ "$p" = sample ]; then
        only=("flodl_proto/codec/auth.py")
    elif [ -n "$files" ]; then
        for f in ${files//,/ }; do
            if [[ " $(extra_modules_for "$p") " == *" $f "* ]]; then
                only+=("flodl_proto/$f")
            else
                only+=("flodl_proto/$p/$f")
            fi
        done
    elif [ -d "$ROOT/flodl_proto/$p" ]; then
        only=("flodl_proto/$p/*")
        for f in $(extra_modules_for "$p"); do only+=("flodl_proto/$f"); done
    else
        for f in $(extra_modules_for "$p"); do only+=("flodl_proto/$f"); done
    fi
    for f in "${only[@]}"; do  # a module named with --files that does not exist: before any copy
        case "$f" in *"*"*) continue ;; esac
        [ -f "$ROOT/$f" ] || { echo "mutate.sh: no module $f (--files)" >&2; exit 2; }
    done
    work="$(mktemp -d "${TMPDIR:-/tmp}/flodl-mutate-$p.XXXXXX")"
    copy_checkout "$work"
    {
        echo
        echo "[tool.mutmut]"
        echo "source_paths = [\"flodl_proto\"]"
        printf 'only_mutate = ['
        local first=1 t
        for t in "${only[@]}"; do
            [ $first -eq 1 ] || printf ', '
            printf '"%s"' "$t"
            first=0
        done
        echo ']'
        # the compiled (numba) kernels cannot run through mutmut's trampolines
        echo "do_not_mutate = [\"flodl_proto/reduce/_jit.py\"]"
        # docs/: the decode tests read the hex dumps of docs/protocol.md
        echo "also_copy = [\"fuzz/\", \"spec/\", \"docs/\"]"
        printf 'pytest_add_cli_args_test_selection = ['
        first=1
        for t in $tests; do
            [ $first -eq 1 ] || printf ', '
            printf '"%s"' "$t"
            first=0
        done
        echo ']'
        printf 'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x", "-p", "no:randomly"'
        for t in $(deselected_for "$p"); do printf ', "--deselect", "%s"' "$t"; done
        echo ']'
        # log calls: their text is for operators, not protocol behaviour (see docs/testing.md)
        echo 'do_not_mutate_patterns = ["^\\s*_?log\\.(debug|info|warning|error|exception)\\("]'
        # a mutant that loops is stopped after a few times its tests' usual CPU time
        echo 'timeout_multiplier = 10.0'
    } >> "$work/pyproject.toml"
    echo "== mutation testing ${only[*]} in $work"
    echo "   tests: $tests"
    local rc=0 names=()
    if [ "$p" = sample ]; then
        names=("flodl_proto.codec.auth.x_compute_tag__mutmut_*" "flodl_proto.codec.auth.x_tags_equal__mutmut_*"
               "flodl_proto.codec.auth.x_tag_as_u64__mutmut_*" "flodl_proto.codec.auth.x_new_mac__mutmut_*")
    elif [ -n "$mutants" ]; then
        read -r -a names <<< "$mutants"
    fi
    (cd "$work" && HYPOTHESIS_PROFILE=mutation FLODL_NET_TIMEOUT_SCALE=0.1 \
        exec setsid -w nice -n 10 "$PY" -m mutmut run --max-children 2 "${names[@]}") &
    child=$!
    wait "$child" || rc=$?
    child=""
    (cd "$work" && "$PY" -m mutmut export-cicd-stats >/dev/null 2>&1 && cat mutants/mutmut-cicd-stats.json) || true
    echo
    echo "== surviving mutants (${only[*]})"
    local survivors
    survivors="$(cd "$work" && "$PY" -m mutmut results 2>/dev/null | grep -E ': (survived|no tests)' \
        | grep -v -F -f <(sed -n 's/^\([^ #][^ ]*\) .*/\1:/p' "$ROOT/tools/mutants-equivalent.txt") || true)"
    if [ $rc -ne 0 ]; then echo "mutmut did not complete (exit $rc)"; else echo "${survivors:-none}"; fi
    # a timeout is a mutant whose tests did not finish in time (a loop, or a loaded machine):
    # listed so it can be re-run with --mutants
    (cd "$work" && "$PY" -m mutmut results 2>/dev/null | grep -E ': timeout' | sed 's/^/timeout: /') || true
    if [ $keep -eq 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
    work=""
    if [ "$p" = sample ] && [ -n "$survivors" ]; then return 1; fi
    return $rc
}

if [ "$pkg" = all ]; then
    if [ -n "$files" ]; then  # module names are a package's: refused before any package runs
        echo "mutate.sh: --files names modules of one package; give the package, not all" >&2
        usage >&2; exit 2
    fi
    status=0
    for p in codec reduce fsm decode; do run_one "$p" || status=1; done
    exit $status
fi
run_one "$pkg"
