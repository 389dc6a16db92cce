#!/usr/bin/env bash
# Mutation testing of the files that enforce the guarantees (docs/mutation.md).
#
#   scripts/mutants.sh run [FILE...]   mutate (default: every guard file), run each package's unit
#                                      and scripted tests against each mutant; slow, not in CI.
#                                      Output in mutants.out/ (outcomes.json, caught.txt,
#                                      missed.txt, ...). MUTANTS_TIMEOUT caps each test run
#                                      (seconds, default 300); MUTANTS_IN_PLACE=1 mutates this
#                                      tree instead of a copy (only in a throw-away copy);
#                                      MUTANTS_RE runs only the mutants whose description
#                                      matches that regex (the rest of a stopped run).
#   scripts/mutants.sh list            the mutants of the guard files, without line numbers.
#   scripts/mutants.sh record          writes that list to docs/mutants.list: after a mutation
#                                      run of changed guard code, and after merging.
#   scripts/mutants.sh check           fails when the list differs from docs/mutants.list, so
#                                      guard code changed without a mutation run shows up
#                                      (scripts/test.sh runs it; about a second).
#
# cargo-mutants comes from the crate registry (`cargo install cargo-mutants --locked`); `check`
# installs the pinned version into the tool cache when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

MUTANTS_VERSION=27.1.0
RECORDED=docs/mutants.list

# The files that enforce the guarantees: the fresh-view step, the writer and its fence, the
# tracker, the elector's acquire/renew/release, the gate, the runtime's drain and release.
GUARD_FILES=(
  crates/cluster/src/view.rs
  crates/cluster/src/writer.rs
  crates/cluster/src/writer/rate.rs
  crates/cluster/src/writer/read.rs
  crates/cluster/src/writer/send.rs
  crates/slices/src/tracker.rs
  crates/leadership/src/elector/config.rs
  crates/leadership/src/elector/handle.rs
  crates/leadership/src/elector/mod.rs
  crates/leadership/src/elector/record.rs
  crates/leadership/src/elector/run/mod.rs
  crates/leadership/src/elector/run/attempt.rs
  crates/leadership/src/elector/run/observe.rs
  crates/leadership/src/elector/run/release.rs
  crates/leadership/src/fence.rs
  crates/leadership/src/gate/mod.rs
  crates/leadership/src/runtime/mod.rs
  crates/leadership/src/runtime/worker.rs
)

cargo_mutants() {
  if ! cargo mutants --version >/dev/null 2>&1; then
    local root="$HOME/.cache/external-endpoints/cargo-mutants-$MUTANTS_VERSION"
    if [ ! -x "$root/bin/cargo-mutants" ]; then
      echo "==> installing cargo-mutants $MUTANTS_VERSION into $root" >&2
      cargo install cargo-mutants --locked --version "$MUTANTS_VERSION" --root "$root" >&2
    fi
    export PATH="$root/bin:$PATH"
  fi
  cargo mutants "$@"
}

# What a mutation run leaves out, in both list and run: tests, and Debug impls (their output is
# no guarantee; a test pinning it would pin wording, not behaviour).
EXCLUDES=(--exclude '**/tests.rs' --exclude '**/tests/**' --exclude-re 'impl .*Debug for')

file_args() {
  local file
  for file in "$@"; do
    printf -- '--file\n%s\n' "$file"
  done
}

# One mutant a line, `path: description`, sorted: line numbers are left out so an edit
# elsewhere in a file does not change the list.
list() {
  mapfile -t args < <(file_args "${GUARD_FILES[@]}")
  cargo_mutants --list "${args[@]}" "${EXCLUDES[@]}" \
    | sed -E 's/^([^:]+):[0-9]+:[0-9]+:/\1:/' | LC_ALL=C sort
}

case "${1:-}" in
  list)
    list
    ;;
  record)
    list >"$RECORDED"
    echo "recorded $(wc -l <"$RECORDED") mutants in $RECORDED"
    ;;
  check)
    current=$(mktemp)
    list >"$current"
    if ! diff -u "$RECORDED" "$current"; then
      echo "The guard files' mutants changed (diff above: - recorded, + now). Run" >&2
      echo "scripts/mutants.sh run on the changed files, record the result in docs/mutation.md," >&2
      echo "then scripts/mutants.sh record." >&2
      rm -f "$current"
      exit 1
    fi
    rm -f "$current"
    echo "mutants of the guard files: as recorded ($(wc -l <"$RECORDED"))"
    ;;
  run)
    shift
    files=("$@")
    [ ${#files[@]} -gt 0 ] || files=("${GUARD_FILES[@]}")
    mapfile -t args < <(file_args "${files[@]}")
    # Two cores shared with others: one build at a time (in place there is only one), and a
    # cap on each test run.
    where=(--jobs 1)
    [ "${MUTANTS_IN_PLACE:-0}" = 1 ] && where=(--in-place)
    only=()
    [ -n "${MUTANTS_RE:-}" ] && only=(--re "$MUTANTS_RE")
    cargo_mutants "${args[@]}" "${EXCLUDES[@]}" "${only[@]}" \
      "${where[@]}" --timeout "${MUTANTS_TIMEOUT:-300}" --no-shuffle
    ;;
  *)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
