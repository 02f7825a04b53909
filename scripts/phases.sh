# Phase timing for scripts/test.sh (sourced, not run): `phase NAME` ends the phase in
# progress and starts NAME; `phase_add NAME SECONDS [NOTE]` records one timed elsewhere (a
# background job). At exit, also after a failure, a table of every phase's minutes and
# seconds is printed, the phase that was in progress when a command failed marked so.
# Needs bash 4.4+ (an empty associative array under `set -u`).

PHASE_NAMES=()
PHASE_SECONDS=()
PHASE_NOTES=()
_PHASE_NOW=""
_PHASE_START=0
_PHASE_T0=$SECONDS

# Ends the phase in progress (if any), with an optional note (e.g. "failed").
phase_end() {
  if [ -n "$_PHASE_NOW" ]; then
    phase_add "$_PHASE_NOW" "$((SECONDS - _PHASE_START))" "${1:-}"
    _PHASE_NOW=""
  fi
}

phase() {
  phase_end
  _PHASE_NOW="$1"
  _PHASE_START=$SECONDS
  echo "== phase: $1" >&2
}

phase_add() {
  PHASE_NAMES+=("$1")
  PHASE_SECONDS+=("$2")
  PHASE_NOTES+=("${3:-}")
}

# Runs "$@" in the background as phase NAME, its output in LOG; phase_wait NAME waits for it
# and records its time (what it overlapped with ran in the foreground meanwhile).
declare -A _PHASE_BG_PID=() _PHASE_BG_LOG=()
phase_background() {
  local name="$1" log="$2"
  shift 2
  (
    # Not the parent's phase table at its exit; stopped (TERM), it stops its child, the
    # trap set before the child starts so that a TERM at once leaves nothing running.
    trap - EXIT
    start=$SECONDS
    rc=0
    child=""
    trap '[ -z "$child" ] || kill -- -"$child" 2>/dev/null; exit 143' TERM
    # Its own process group (job control on), so that stopping it stops all it started.
    set -m
    "$@" >"$log" 2>&1 &
    child=$!
    wait "$child" || rc=$?
    echo "$((SECONDS - start)) $rc" >"$log.time"
    exit "$rc"
  ) &
  _PHASE_BG_PID[$name]=$!
  _PHASE_BG_LOG[$name]=$log
  echo "== phase: $name (in the background, output in $log)" >&2
}

phase_wait() {
  local name="$1" rc=0 secs=0 note=""
  wait "${_PHASE_BG_PID[$name]}" || rc=$?
  unset "_PHASE_BG_PID[$name]"
  read -r secs _ <"${_PHASE_BG_LOG[$name]}.time" || true
  [ "$rc" = 0 ] || note="failed (exit $rc)"
  phase_add "$name (background)" "$secs" "$note"
  return "$rc"
}

_phase_fmt() { printf '%d:%02d' "$(($1 / 60))" "$(($1 % 60))"; }

phase_table() {
  local rc=$? i pid
  # A background phase still running when a foreground one failed: ours, stopped.
  for pid in "${_PHASE_BG_PID[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${_PHASE_BG_PID[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "$rc" != 0 ]; then phase_end "failed (exit $rc)"; else phase_end; fi
  {
    echo
    echo "phase times (min:s)"
    for i in "${!PHASE_NAMES[@]}"; do
      printf '  %-46s %7s  %s\n' "${PHASE_NAMES[$i]}" "$(_phase_fmt "${PHASE_SECONDS[$i]}")" \
        "${PHASE_NOTES[$i]}"
    done
    printf '  %-46s %7s  %s\n' "total (wall clock)" "$(_phase_fmt "$((SECONDS - _PHASE_T0))")" \
      "exit $rc"
  } >&2
  return "$rc"
}

trap phase_table EXIT
