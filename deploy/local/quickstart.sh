#!/usr/bin/env bash
# deploy/local/quickstart.sh — the whole product on one machine, in about a minute.
#
# Starts the pinned Conductor (deploy/local/conductor.sh), builds and starts the sidecar with
# its embedded NATS JetStream, submits deploy/local/plans/quickstart.yaml (prepare, then three
# steps of 3, 4 and 5 s in parallel, then publish), pauses the run while the three steps are in
# flight, shows the pause draining them (PAUSED (DRAINING) -> PAUSED), checks in the event log
# that no step started while paused, resumes, and waits for COMPLETED. Exits 0 only if every
# check held; otherwise it says what failed and prints the end of the sidecar's log.
# CI runs it as a test.
#
# Needs bash, curl, go, and a JDK 17+ (unless a Conductor already answers on the port).
#
# Environment (all optional):
#   CONDUCTOR_PORT, CONDUCTOR_HOST, CONDUCTOR_STATE_DIR, ...  passed to conductor.sh (default :8080).
#                          A Conductor already answering there is used and left running;
#                          one this script starts is stopped at the end.
#   SIDECAR_LISTEN         the sidecar's API address (default 127.0.0.1:8787); the script fails
#                          if it is taken. SIDECAR_LISTEN=127.0.0.1:0 picks a free port.
#   SIDECAR_STORE          nats (default): the log in the sidecar's embedded JetStream;
#                          postgres: the log, the event ids and the control replies in a
#                          PostgreSQL cluster this script starts (deploy/local/postgres.sh,
#                          Debian's package, installed if missing) and stops at the end
#   QUICKSTART_PG_PORT     that cluster's port (default 15433)
#   QUICKSTART_TIMEOUT     seconds each wait may take (default 120)
#   QUICKSTART_KEEP        1 keeps the temp dir (binary, log, NATS data) after a success too
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
plan_file=deploy/local/plans/quickstart.yaml
parallel_steps=(build-a build-b build-c)

conductor_host=${CONDUCTOR_HOST:-127.0.0.1}
conductor_port=${CONDUCTOR_PORT:-8080}
conductor_base=http://$conductor_host:$conductor_port
listen=${SIDECAR_LISTEN:-127.0.0.1:8787}
wait_timeout=${QUICKSTART_TIMEOUT:-120}
keep=${QUICKSTART_KEEP:-0}
store=${SIDECAR_STORE:-nats}
pg_port=${QUICKSTART_PG_PORT:-15433}
pg_dir=

tmp=
sidecar_pid=
started_conductor=0
ok=0
step_no=0
steps_total=9

# ---------------------------------------------------------------- output and failure

step() { # step TITLE [EXPLANATION...]
  step_no=$((step_no + 1))
  printf '\n[%d/%d] %s\n' "$step_no" "$steps_total" "$1"
  shift
  local l
  for l in "$@"; do printf '      %s\n' "$l"; done
}

say() { printf '      %s\n' "$*"; }

indent() { # copy stdin to stdout, indented, line by line as it arrives
  local l
  while IFS= read -r l || [[ -n $l ]]; do printf '        %s\n' "$l"; done
}

show() { # show CMD...: print the command, run it, print its output indented; keeps its exit code
  printf '      $ %s\n' "$*"
  local rc=0
  "$@" 2>&1 | indent || rc=$?
  return "$rc"
}

fail() {
  printf '\nquickstart FAILED: %s\n' "$*" >&2
  if [[ -n $tmp && -s $tmp/sidecar.log ]]; then
    printf '\nlast 40 lines of the sidecar log %s:\n' "$tmp/sidecar.log" >&2
    tail -n 40 "$tmp/sidecar.log" >&2 || true
  fi
  exit 1
}

# ---------------------------------------------------------------- cleanup

stop_sidecar() {
  [[ -n $sidecar_pid ]] || return 0
  local pid=$sidecar_pid waited=0
  sidecar_pid=
  kill -0 "$pid" 2>/dev/null || {
    wait "$pid" 2>/dev/null || true
    return 0
  }
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null && ((waited < 150)); do # 15 s; its shutdown grace is 5 s
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    printf 'quickstart: sidecar (pid %s) still running 15 s after SIGTERM; sending SIGKILL\n' "$pid" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_sidecar
  if [[ -n $pg_dir ]]; then
    printf '\nStopping the PostgreSQL cluster this script started:\n'
    PG_STATE_DIR=$pg_dir/pg PG_PORT=$pg_port PG_DATABASE=sidecar deploy/local/postgres.sh stop 2>&1 | indent || true
    if ((ok)) && [[ $keep != 1 ]]; then
      rm -rf "$pg_dir"
    else
      printf 'Kept for inspection: %s (the PostgreSQL cluster holding the event log)\n' "$pg_dir" >&2
    fi
  fi
  if ((started_conductor)); then
    printf '\nStopping the Conductor this script started:\n'
    deploy/local/conductor.sh stop 2>&1 | indent || true
  fi
  if [[ -n $tmp && -d $tmp ]]; then
    if ((ok)) && [[ $keep != 1 ]]; then
      rm -rf "$tmp"
    else
      rm -f "$tmp/bin/sidecar"
      printf '\nKept for inspection: %s (sidecar.log, data/ with the JetStream event log)\n' "$tmp" >&2
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'printf "\nquickstart: interrupted\n" >&2; exit 130' INT
trap 'printf "\nquickstart: terminated\n" >&2; exit 143' TERM

# ---------------------------------------------------------------- helpers

need() { command -v "$1" >/dev/null 2>&1 || fail "'$1' is required but not on PATH${2:+ ($2)}"; }

port_open() { (: <>"/dev/tcp/$1/$2") 2>/dev/null; }

conductor_healthy() {
  local body
  body=$(curl -fsS -m 5 "$conductor_base/health" 2>/dev/null) || return 1
  [[ $body == *'"healthy":true'* ]]
}

# wait_until DESCRIPTION CMD...: run CMD every 0.25 s until it succeeds; fail after the timeout.
wait_until() {
  local what=$1 deadline=$((SECONDS + wait_timeout))
  shift
  until "$@"; do
    if ((SECONDS >= deadline)); then
      fail "timed out after ${wait_timeout} s waiting for $what (QUICKSTART_TIMEOUT)"
    fi
    sidecar_alive
    sleep 0.25
  done
}

sidecar_alive() {
  [[ -z $sidecar_pid ]] || kill -0 "$sidecar_pid" 2>/dev/null || fail "the sidecar (pid $sidecar_pid) exited"
}

# status_of RUN: the run's status line as "sidecar status" prints it, e.g. "PAUSED (DRAINING)";
# the whole output is left in $tmp/status.txt.
status_of() {
  sidecar status "$1" >"$tmp/status.txt" 2>&1 || fail "sidecar status $1: $(cat "$tmp/status.txt")"
  sed -n 's/^status  *//p' "$tmp/status.txt"
}

steps_running() { # steps_running RUN: true once every parallel step is RUNNING
  local st s
  st=$(status_of "$1")
  case $st in
    COMPLETED | FAILED | CANCELLED) fail "run $1 is $st before its parallel steps were seen running" ;;
  esac
  for s in "${parallel_steps[@]}"; do
    grep -Eq "^step +$s +RUNNING " "$tmp/status.txt" || return 1
  done
}

run_terminal() { # run_terminal RUN: true once the run has ended
  case $(status_of "$1") in
    COMPLETED | FAILED | CANCELLED) return 0 ;;
  esac
  return 1
}

# check_events FILE: the checks on the event log ("sidecar events" text output:
# runSeq persistedAt eventType stepId ...). Prints one line per problem.
check_events() {
  awk -v parallel="${parallel_steps[*]}" '
    { seq[NR] = $1; type[NR] = $3; step[NR] = $4; n[$3]++; if ($4 != "-") n[$3 " " $4]++
      if (!($3 in first)) first[$3] = $1 }
    END {
      split("RunStarted RunPaused RunDrainCompleted RunResumed RunCompleted", once, " ")
      for (i in once) if (n[once[i]] != 1) printf "%s appears %d times, want 1\n", once[i], n[once[i]]
      p = first["RunPaused"]; d = first["RunDrainCompleted"]; r = first["RunResumed"]; c = first["RunCompleted"]
      if (!(p < d && d < r && r < c)) print "want RunPaused < RunDrainCompleted < RunResumed < RunCompleted"
      split("prepare " parallel " publish", all, " ")
      for (i in all) for (t = 0; t < 2; t++) {
        k = (t ? "StepCompleted " : "StepStarted ") all[i]
        if (n[k] != 1) printf "%s appears %d times, want 1\n", k, n[k]
      }
      for (i = 1; i <= NR; i++) {
        if (type[i] == "StepStarted" && seq[i] > p && seq[i] < r)
          printf "step %s started at runSeq %d, while the run was paused (RunPaused %d, RunResumed %d)\n", step[i], seq[i], p, r
        if (type[i] == "StepStarted" && step[i] == "publish" && seq[i] < r)
          printf "publish started before RunResumed\n"
        if (type[i] == "StepCompleted" && index(" " parallel " ", " " step[i] " ") && !(seq[i] > p && seq[i] < d))
          printf "%s completed at runSeq %d, not during the drain (RunPaused %d, RunDrainCompleted %d)\n", step[i], seq[i], p, d
      }
    }' "$1"
}

# ---------------------------------------------------------------- main

need curl
need go "https://go.dev/dl/"
case $store in
  nats) ;;
  postgres) steps_total=10 ;;
  *) fail "SIDECAR_STORE must be nats or postgres, got '$store'" ;;
esac
[[ $pg_port =~ ^[0-9]+$ ]] || fail "QUICKSTART_PG_PORT must be a TCP port, got '$pg_port'"
[[ $wait_timeout =~ ^[0-9]+$ ]] || fail "QUICKSTART_TIMEOUT must be whole seconds, got '$wait_timeout'"
[[ $listen == *:* ]] || fail "SIDECAR_LISTEN must be host:port, got '$listen'"
listen_host=${listen%:*}
listen_port=${listen##*:}
[[ $listen_port =~ ^[0-9]+$ ]] || fail "SIDECAR_LISTEN must be host:port, got '$listen'"
case $listen_host in "" | 0.0.0.0 | "[::]") probe_host=127.0.0.1 ;; *) probe_host=$listen_host ;; esac
if ((listen_port != 0)) && port_open "$probe_host" "$listen_port"; then
  fail "the sidecar's address $listen is already in use (another sidecar?); stop it, or set SIDECAR_LISTEN (e.g. SIDECAR_LISTEN=127.0.0.1:0 for any free port)"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-quickstart.XXXXXX")
mkdir -p "$tmp/bin"
export PATH="$tmp/bin:$PATH"
t0=$SECONDS
printf 'Conductor sidecar quickstart (repo %s, temp dir %s)\n' "$repo" "$tmp"

step "Conductor: the pinned conductor-oss server on $conductor_base" \
  "The sidecar drives runs through it: each plan step becomes a Conductor task."
if conductor_healthy; then
  say "already running and healthy at $conductor_base: using it (and leaving it running)"
else
  rc=0
  deploy/local/conductor.sh status >/dev/null 2>&1 || rc=$?
  if ((rc != 1)); then # 1: started by conductor.sh and still starting up; not ours to stop
    started_conductor=1
  fi
  show deploy/local/conductor.sh start || fail "deploy/local/conductor.sh start failed (see its output above)"
fi

store_args=(--store nats)
log_home="JetStream"
if [[ $store == postgres ]]; then
  step "PostgreSQL: a throw-away cluster on 127.0.0.1:$pg_port (deploy/local/postgres.sh)" \
    "With --store postgres://... the run event log, the event ids and the control replies are" \
    "rows of its database 'sidecar'; the sidecar applies its schema migrations at start."
  port_open 127.0.0.1 "$pg_port" && fail "127.0.0.1:$pg_port is in use; set QUICKSTART_PG_PORT"
  pg_dir=$(mktemp -d "${TMPDIR:-/tmp}/sidecar-quickstart-pg.XXXXXX")
  chmod 755 "$pg_dir" # as root the cluster belongs to the postgres user, who must enter it
  PG_STATE_DIR=$pg_dir/pg PG_PORT=$pg_port PG_DATABASE=sidecar show deploy/local/postgres.sh start ||
    fail "deploy/local/postgres.sh start failed (see its output above)"
  store_args=(--store "postgres://sidecar@127.0.0.1:$pg_port/sidecar?sslmode=disable")
  log_home="PostgreSQL (table run_events)"
fi

step "Build the sidecar (go build ./cmd/sidecar)"
s=$SECONDS
go build -o "$tmp/bin/sidecar" ./cmd/sidecar || fail "go build ./cmd/sidecar failed"
say "built $tmp/bin/sidecar in $((SECONDS - s)) s"

worker_id="quickstart-$(hostname 2>/dev/null || echo local)-$$"
step "Start the sidecar: sidecar serve" \
  "The run event log is in $log_home; embedded NATS in $tmp/data keeps the rest; task workers poll Conductor" \
  "as worker '$worker_id'; the control API listens on $listen."
# Every setting that matters is a flag, so SIDECAR_* variables in the caller's environment
# (an external --nats-url, another data dir) cannot change what this script runs.
sidecar serve --conductor-url "$conductor_base/api" "${store_args[@]}" --nats-url "" --data-dir "$tmp/data" \
  --listen "$listen" --worker-id "$worker_id" --drain-timeout 5m --shutdown-grace 5s \
  --log-format console >"$tmp/sidecar.log" 2>&1 &
sidecar_pid=$!
s=$SECONDS
if ((listen_port == 0)); then
  # the real address is in the "sidecar ready" log line
  addr_known() { addr=$(sed -n 's/.*sidecar ready.*"listen": "\([^"]*\)".*/\1/p' "$tmp/sidecar.log" | head -n 1) && [[ -n $addr ]]; }
  wait_until "the sidecar to log its address" addr_known
else
  addr=$probe_host:$listen_port
fi
export SIDECAR_SERVER=http://$addr # the address the client commands below use
ready() { curl -fsS -m 2 -o /dev/null "$SIDECAR_SERVER/readyz" 2>/dev/null; }
wait_until "the sidecar's $SIDECAR_SERVER/readyz" ready
say "ready after $((SECONDS - s)) s (pid $sidecar_pid, API $SIDECAR_SERVER, log $tmp/sidecar.log)"

step "Submit the example plan $plan_file" \
  "prepare -> build-a | build-b | build-c (3, 4 and 5 s, in parallel) -> publish"
show sidecar run submit "$plan_file" | tee "$tmp/submit.txt" || fail "sidecar run submit failed"
run_id=$(sed -n 's/^ *run \([^ ]*\) started$/\1/p' "$tmp/submit.txt")
[[ -n $run_id ]] || fail "no run id in the output of sidecar run submit"

step "Wait until the three parallel steps are running"
wait_until "build-a, build-b and build-c to be RUNNING" steps_running "$run_id"
show sidecar status "$run_id"

step "Pause while they run" \
  "PAUSE records RunPaused and stops new steps at once; steps in flight finish (the run shows" \
  "PAUSED (DRAINING)) and then the run is PAUSED. --wait follows the drain and exits 0 once drained."
rc=0
show sidecar pause "$run_id" --wait --timeout 60s --reason quickstart | tee "$tmp/pause.txt" || rc=$?
((rc == 0)) || fail "sidecar pause --wait exited $rc (3: the drain timed out)"
grep -q 'PAUSED (DRAINING): Workflow paused\. Waiting for 3 in-flight tasks to complete\.' "$tmp/pause.txt" ||
  fail "pause --wait did not show PAUSED (DRAINING) with 3 in-flight tasks"
st=$(status_of "$run_id")
[[ $st == PAUSED ]] || fail "after the drain the run is '$st', want PAUSED (no substatus)"
say "Drained. Holding the pause for 3 s: publish is ready to run but must not start."
sleep 3
show sidecar status "$run_id"
st=$(status_of "$run_id")
[[ $st == PAUSED ]] || fail "3 s after the drain the run is '$st', want PAUSED"
sidecar events "$run_id" >"$tmp/events.txt" 2>&1 || fail "sidecar events: $(cat "$tmp/events.txt")"
started_while_paused=$(awk '$3 == "RunPaused" { p = 1 } p && $3 == "StepStarted" { print $4 }' "$tmp/events.txt")
[[ -z $started_while_paused ]] || fail "step(s) started while the run was paused: $started_while_paused"
say "event log: no step started since RunPaused"

step "Resume and wait for the run to complete"
show sidecar resume "$run_id" || fail "sidecar resume failed"
wait_until "run $run_id to end" run_terminal "$run_id"
show sidecar status "$run_id"
st=$(status_of "$run_id")
[[ $st == COMPLETED ]] || fail "run $run_id ended $st, want COMPLETED"

step "The run's event log" \
  "Append-only, one record per event, kept in $log_home; the snapshot above is projected from it."
show sidecar events "$run_id" || fail "sidecar events failed"
sidecar events "$run_id" >"$tmp/events.txt" 2>&1 || fail "sidecar events failed"
say "event types in order:"
awk '{print $3 ($4 == "-" ? "" : "(" $4 ")")}' "$tmp/events.txt" | paste -sd' ' - | fold -s -w 90 | sed 's/ *$//' | indent
problems=$(check_events "$tmp/events.txt")
[[ -z $problems ]] || fail "the event log does not show a clean pause, drain and resume:
$problems"
say "checked: each step started and completed once; build-a, build-b and build-c completed during"
say "the drain; no step started between RunPaused and RunResumed; publish ran after RunResumed."
if [[ $store == postgres ]]; then
  n=$(wc -l <"$tmp/events.txt")
  rows=$(psql -h 127.0.0.1 -p "$pg_port" -U sidecar -d sidecar -tAc \
    "select count(*) from run_events where run_id = '$run_id'" 2>&1) || fail "psql: $rows"
  [[ $rows == "$n" ]] || fail "PostgreSQL holds $rows events of run $run_id, sidecar events shows $n"
  say "checked in PostgreSQL: table run_events holds the run's $rows events"
fi

if ((started_conductor)); then
  step "Stop the sidecar (SIGTERM) and the Conductor this script started"
else
  step "Stop the sidecar (SIGTERM); the Conductor that was already running keeps running"
fi
stop_sidecar
say "sidecar stopped"
if ((started_conductor)); then
  started_conductor=0
  show deploy/local/conductor.sh stop || fail "deploy/local/conductor.sh stop failed"
fi

ok=1
printf '\nquickstart OK: run %s COMPLETED (paused, drained, resumed) in %d s\n' "$run_id" "$((SECONDS - t0))"
