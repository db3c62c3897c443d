#!/usr/bin/env bash
# deploy/local/postgres.sh — a throw-away PostgreSQL cluster for a local Conductor.
#
#   postgres.sh start    install Debian's PostgreSQL if it is missing, create the cluster
#                        under the state dir on first use, start it, create the database
#   postgres.sh stop     stop the cluster this script started (its data dir's postmaster)
#   postgres.sh status   exit 0 only if the cluster answers
#   postgres.sh url      print the JDBC URL
#
# The cluster listens on 127.0.0.1 only, trusts local connections (it is a test
# fixture, never a production database) and keeps its socket in the state dir, so
# several clusters run side by side. PostgreSQL refuses to run as root: as root the
# cluster belongs to the `postgres` user that Debian's package creates.
#
# Environment (all optional):
#   PG_STATE_DIR   the cluster's directory (default /tmp/conductor-sidecar-postgres)
#   PG_PORT        its TCP port (default 15432)
#   PG_DATABASE    the database to create (default conductor; the user has the same name)
set -euo pipefail

STATE_DIR=${PG_STATE_DIR:-/tmp/conductor-sidecar-postgres}
PORT=${PG_PORT:-15432}
DB=${PG_DATABASE:-conductor}
DATA=$STATE_DIR/data
LOG_FILE=$STATE_DIR/postgres.log

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

[[ $PORT =~ ^[0-9]+$ ]] && ((PORT > 0 && PORT < 65536)) || die "PG_PORT must be a TCP port, got '$PORT'"
[[ $DB =~ ^[a-z_][a-z0-9_]*$ ]] || die "PG_DATABASE must be a plain lower-case name, got '$DB'"

# bindir: the newest installed server's bin directory.
bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [[ -n $d && -x $d/pg_ctl ]] && printf '%s\n' "$d"
}

install() {
  bindir >/dev/null && return 0
  command -v apt-get >/dev/null 2>&1 || die "PostgreSQL is not installed and apt-get is missing; install the server (postgresql) by hand"
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null 2>&1 || die "PostgreSQL is not installed; run as root or install it: apt-get install postgresql"
    sudo=(sudo)
  fi
  log "installing Debian's postgresql (no default cluster)"
  # The package would create and start a cluster on 5432; this script makes its own.
  "${sudo[@]}" mkdir -p /etc/postgresql-common
  [[ -f /etc/postgresql-common/createcluster.conf ]] ||
    printf 'create_main_cluster = false\n' | "${sudo[@]}" tee /etc/postgresql-common/createcluster.conf >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confold postgresql >&2 ||
    {
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confold postgresql >&2
    } || die "apt-get install postgresql failed"
  bindir >/dev/null || die "postgresql installed but no /usr/lib/postgresql/*/bin/pg_ctl"
}

# as: run a command as the cluster's owner.
as() {
  if ((EUID == 0)); then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

running() { [[ -f $DATA/postmaster.pid ]] && as "$(bindir)/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

cmd_start() {
  install
  local bin
  bin=$(bindir)
  if ((EUID == 0)); then
    id postgres >/dev/null 2>&1 || die "running as root needs the 'postgres' user (Debian's package creates it)"
    mkdir -p "$STATE_DIR"
    chown postgres: "$STATE_DIR"
  else
    mkdir -p "$STATE_DIR"
  fi
  if [[ ! -f $DATA/PG_VERSION ]]; then
    log "creating the cluster in $DATA"
    as "$bin/initdb" -D "$DATA" -U "$DB" --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$STATE_DIR/initdb.log" 2>&1 ||
      die "initdb failed; see $STATE_DIR/initdb.log"
    {
      printf "listen_addresses = '127.0.0.1'\n"
      printf 'port = %s\n' "$PORT"
      printf "unix_socket_directories = '%s'\n" "$STATE_DIR"
      printf 'max_connections = 200\n'
    } >>"$DATA/postgresql.conf"
  fi
  if running; then
    log "already running: $(url)"
  else
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      die "port 127.0.0.1:$PORT is in use by a process this script did not start; set PG_PORT"
    fi
    as "$bin/pg_ctl" -D "$DATA" -l "$LOG_FILE" -o "-p $PORT" -w -t 60 start </dev/null >/dev/null ||
      die "the cluster did not start; see $LOG_FILE"
    log "started on 127.0.0.1:$PORT (data $DATA, log $LOG_FILE)"
  fi
  if ! as psql -h "$STATE_DIR" -p "$PORT" -U "$DB" -d postgres -tAc "select 1 from pg_database where datname = '$DB'" | grep -q 1; then
    as psql -h "$STATE_DIR" -p "$PORT" -U "$DB" -d postgres -qc "create database $DB" || die "could not create database $DB"
  fi
}

cmd_stop() {
  if [[ ! -f $DATA/postmaster.pid ]]; then
    log "not running"
    return 0
  fi
  as "$(bindir)/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null || die "pg_ctl stop failed; see $LOG_FILE"
  log "stopped"
}

url() { printf 'jdbc:postgresql://127.0.0.1:%s/%s\n' "$PORT" "$DB"; }

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) running && log "running: $(url)" || {
    log "not running"
    exit 3
  } ;;
  url) url ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2 && exit 2 ;;
esac
