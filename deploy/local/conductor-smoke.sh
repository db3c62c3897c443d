#!/usr/bin/env bash
# deploy/local/conductor-smoke.sh — exercise the Conductor endpoints the sidecar's adapter uses
# against a running server (default: the one deploy/local/conductor.sh started) and check the
# status codes and behaviours recorded in deploy/local/README.md. Needs only bash and curl.
#
#   CONDUCTOR_URL   base URL without /api (default: `conductor.sh url`, i.e. http://127.0.0.1:8080)
#
# Exit 0 when every check passes; otherwise prints each failed check and exits 1.
# Definitions get a unique suffix, so the script can run repeatedly against a persistent store;
# it unregisters them at the end.
# Checks are strings passed to eval, so their $variables expand when the check runs:
# shellcheck disable=SC2016,SC2034
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
BASE=${CONDUCTOR_URL:-$("$here/conductor.sh" url)}
API=$BASE/api
SUFFIX=$(date +%s)_$$
TASK=smoke_task_$SUFFIX
WF=smoke_wf_$SUFFIX
failures=0
CODE=
BODY=
CTYPE=

log() { printf 'conductor-smoke.sh: %s\n' "$*" >&2; }

TMP=$(mktemp)
trap 'rm -f "$TMP"' EXIT
req() { # req METHOD PATH [JSON]: sets CODE, BODY (from a temp file), CTYPE
  local method=$1 path=$2 data=${3:-} out
  local -a args=(-sS -m 30 -X "$method" -o "$TMP" -w '%{http_code} %{content_type}')
  [[ -n $data ]] && args+=(-H 'Content-Type: application/json' --data "$data")
  out=$(curl "${args[@]}" "$API$path") || out="000 "
  CODE=${out%% *}
  CTYPE=${out#* }
  BODY=$(<"$TMP")
}

check() { # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then
    printf 'ok    %s\n' "$what"
  else
    printf 'FAIL  %s (HTTP %s, body: %.300s)\n' "$what" "$CODE" "$BODY"
    failures=$((failures + 1))
  fi
}

code_is() { [[ $CODE == "$1" ]]; }
body_has() { [[ $BODY == *"$1"* ]]; }
body_empty() { [[ -z $BODY ]]; }

json_field() { # json_field NAME: first "NAME":"value" (string) or "NAME":number in BODY
  local re_s="\"$1\":\"([^\"]*)\"" re_n="\"$1\":(-?[0-9]+)"
  if [[ $BODY =~ $re_s ]] || [[ $BODY =~ $re_n ]]; then
    printf '%s\n' "${BASH_REMATCH[1]}"
  fi
}

wf_status() { # wf_status ID: prints workflow status
  req GET "/workflow/$1?includeTasks=false"
  json_field status
}

count_tasks() { # count_tasks ID: number of tasks in the workflow
  req GET "/workflow/$1?includeTasks=true"
  grep -o '"taskId":"' <<<"$BODY" | wc -l | tr -d ' '
}

poll() { # poll: poll $TASK once (waiting up to 5 s for a task to show up)
  local _
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    req GET "/tasks/poll/$TASK?workerid=smoke"
    [[ $CODE == 200 ]] && return 0
    sleep 0.5
  done
}

log "checking $API"

# ---- health
CODE=$(curl -s -o "$TMP" -w '%{http_code}' "$BASE/health") || CODE=000
BODY=$(<"$TMP")
check "GET /health -> 200 {\"healthy\":true}" eval 'code_is 200 && body_has "\"healthy\":true"'

# ---- metadata
req POST /metadata/taskdefs "[{\"name\":\"$TASK\",\"retryCount\":1,\"retryLogic\":\"FIXED\",\"retryDelaySeconds\":0,\"timeoutSeconds\":300,\"responseTimeoutSeconds\":60,\"timeoutPolicy\":\"TIME_OUT_WF\",\"ownerEmail\":\"smoke@example.com\"}]"
check "POST /api/metadata/taskdefs -> 200, empty body" eval 'code_is 200 && body_empty'
req POST /metadata/taskdefs "[{\"name\":\"$TASK\",\"retryCount\":1,\"retryLogic\":\"FIXED\",\"retryDelaySeconds\":0,\"timeoutSeconds\":300,\"responseTimeoutSeconds\":60,\"timeoutPolicy\":\"TIME_OUT_WF\",\"ownerEmail\":\"smoke@example.com\"}]"
check "POST /api/metadata/taskdefs again -> 200 (upsert)" code_is 200
wfdef="{\"name\":\"$WF\",\"version\":1,\"schemaVersion\":2,\"ownerEmail\":\"smoke@example.com\",\"tasks\":[{\"name\":\"$TASK\",\"taskReferenceName\":\"t1\",\"type\":\"SIMPLE\",\"inputParameters\":{\"x\":\"\${workflow.input.x}\"}},{\"name\":\"$TASK\",\"taskReferenceName\":\"t2\",\"type\":\"SIMPLE\"}]}"
req POST /metadata/workflow "$wfdef"
check "POST /api/metadata/workflow -> 200, empty body" eval 'code_is 200 && body_empty'
req POST /metadata/workflow "$wfdef"
check "POST /api/metadata/workflow again -> 409 memory store / 500 sqlite store, 'already exists' (not an upsert)" eval '[[ $CODE == 409 || $CODE == 500 ]] && body_has "already exists"'
req PUT /metadata/workflow "[$wfdef]"
check "PUT /api/metadata/workflow [def] -> 200 (upsert)" code_is 200

# ---- empty poll
req GET "/tasks/poll/$TASK?workerid=smoke"
check "GET /api/tasks/poll/{type} with empty queue -> 204, empty body" eval 'code_is 204 && body_empty'

# ---- start
req POST "/workflow/$WF" '{"x":42}'
WID=$BODY
check "POST /api/workflow/{name} -> 200 text/plain workflowId" eval 'code_is 200 && [[ $CTYPE == text/plain* && ${#WID} == 36 ]]'
req POST /workflow "{\"name\":\"$WF\",\"version\":1,\"correlationId\":\"smoke-$SUFFIX\",\"input\":{\"x\":1}}"
WID2=$BODY
check "POST /api/workflow (StartWorkflowRequest) -> 200 text/plain workflowId" eval 'code_is 200 && [[ ${#WID2} == 36 ]]'

# ---- poll t1, pause, complete while paused, resume
poll
check "GET /api/tasks/poll/{type} -> 200 task t1, status IN_PROGRESS, retryCount 0" eval 'code_is 200 && body_has "\"referenceTaskName\":\"t1\"" && body_has "\"status\":\"IN_PROGRESS\"" && body_has "\"retryCount\":0" && body_has "\"workflowInstanceId\":\"$WID\""'
T1=$(json_field taskId)
req PUT "/workflow/$WID/pause"
check "PUT /api/workflow/{id}/pause -> 200, empty body" eval 'code_is 200 && body_empty'
req PUT "/workflow/$WID/pause"
check "PUT /api/workflow/{id}/pause on a PAUSED workflow -> 200 (no-op)" code_is 200
check "workflow status PAUSED" eval '[[ $(wf_status "$WID") == PAUSED ]]'
req POST /tasks "{\"workflowInstanceId\":\"$WID\",\"taskId\":\"$T1\",\"status\":\"COMPLETED\",\"outputData\":{\"ok\":true},\"workerId\":\"smoke\"}"
check "POST /api/tasks COMPLETED while paused -> 200 text/plain taskId" eval 'code_is 200 && [[ $BODY == "$T1" ]]'
sleep 1
check "paused workflow schedules no next task (1 task)" eval '[[ $(count_tasks "$WID") == 1 ]]'
req PUT "/workflow/$WID/resume"
check "PUT /api/workflow/{id}/resume -> 200, empty body" eval 'code_is 200 && body_empty'
req PUT "/workflow/$WID/resume"
check "PUT /api/workflow/{id}/resume on a RUNNING workflow -> 500 (not 409)" eval 'code_is 500 && body_has "is not PAUSED"'
check "after resume t2 is scheduled (2 tasks), status RUNNING" eval '[[ $(count_tasks "$WID") == 2 && $(wf_status "$WID") == RUNNING ]]'

# ---- the other workflow's t1 is next in the queue; terminate that workflow first
req DELETE "/workflow/$WID2?reason=smoke%20terminate"
check "DELETE /api/workflow/{id}?reason=... -> 200, empty body" eval 'code_is 200 && body_empty'
req GET "/workflow/$WID2?includeTasks=true"
check "terminated workflow: TERMINATED, reasonForIncompletion = reason, task CANCELED" eval 'body_has "\"status\":\"TERMINATED\"" && body_has "\"reasonForIncompletion\":\"smoke terminate\"" && body_has "\"status\":\"CANCELED\""'
req DELETE "/workflow/$WID2?reason=again"
check "DELETE on a TERMINATED workflow -> 200 (no-op)" code_is 200
req PUT "/workflow/$WID2/pause"
check "PUT pause on a TERMINATED workflow -> 409" code_is 409
req PUT "/workflow/$WID2/resume"
check "PUT resume on a TERMINATED workflow -> 500" code_is 500
req GET "/workflow/00000000-0000-4000-8000-000000000000"
check "GET unknown workflow -> 404" code_is 404

# ---- t2: fail once (retryCount 1 on the def), then complete
poll
check "poll -> t2 of the resumed workflow" eval 'code_is 200 && body_has "\"referenceTaskName\":\"t2\"" && body_has "\"workflowInstanceId\":\"$WID\""'
T2=$(json_field taskId)
req POST /tasks "{\"workflowInstanceId\":\"$WID\",\"taskId\":\"$T2\",\"status\":\"FAILED\",\"reasonForIncompletion\":\"smoke failure\",\"workerId\":\"smoke\"}"
check "POST /api/tasks FAILED -> 200" code_is 200
poll
check "retry is a new task: new taskId, retryCount 1, retriedTaskId = failed taskId" eval 'code_is 200 && body_has "\"retryCount\":1" && body_has "\"retriedTaskId\":\"$T2\"" && [[ $(json_field taskId) != "$T2" ]]'
T2B=$(json_field taskId)
req POST /tasks "{\"workflowInstanceId\":\"$WID\",\"taskId\":\"$T2B\",\"status\":\"IN_PROGRESS\",\"callbackAfterSeconds\":2,\"workerId\":\"smoke\"}"
check "POST /api/tasks IN_PROGRESS callbackAfterSeconds=2 -> 200 (hand back)" code_is 200
req GET "/tasks/poll/$TASK?workerid=smoke"
check "handed-back task is not pollable before callbackAfterSeconds -> 204" code_is 204
sleep 2.5
poll
check "handed-back task is polled again later: same taskId, pollCount 2" eval 'code_is 200 && [[ $(json_field taskId) == "$T2B" ]] && body_has "\"pollCount\":2"'
req POST /tasks "{\"workflowInstanceId\":\"$WID\",\"taskId\":\"$T2B\",\"status\":\"COMPLETED\",\"outputData\":{\"ok\":true},\"workerId\":\"smoke\"}"
check "POST /api/tasks COMPLETED -> 200" code_is 200
sleep 0.5
check "workflow COMPLETED" eval '[[ $(wf_status "$WID") == COMPLETED ]]'
req PUT "/workflow/$WID/pause"
check "PUT pause on a COMPLETED workflow -> 409" code_is 409

# ---- pause does not gate polling; terminate cancels; late worker updates are swallowed
req POST "/workflow/$WF" '{"x":3}'
WID3=$BODY
req PUT "/workflow/$WID3/pause"
poll
check "task SCHEDULED before the pause is still handed out by poll while PAUSED" eval 'code_is 200 && body_has "\"workflowInstanceId\":\"$WID3\""'
T3=$(json_field taskId)
req DELETE "/workflow/$WID3?reason=smoke%20cancel"
check "DELETE on a PAUSED workflow -> 200, status TERMINATED" eval 'code_is 200 && [[ $(wf_status "$WID3") == TERMINATED ]]'
req POST /tasks "{\"workflowInstanceId\":\"$WID3\",\"taskId\":\"$T3\",\"status\":\"COMPLETED\",\"workerId\":\"smoke\"}"
check "late COMPLETED for a task of a TERMINATED workflow -> 200 (ignored)" code_is 200
req GET "/tasks/$T3"
check "GET /api/tasks/{taskId}: that task stays CANCELED" eval 'code_is 200 && body_has "\"status\":\"CANCELED\""'
req GET "/tasks/00000000-0000-4000-8000-000000000000"
check "GET /api/tasks/{unknown taskId} -> 204 on 3.21, 404 on 3.32" eval 'code_is 204 || code_is 404'
req POST /tasks "{\"workflowInstanceId\":\"$WID3\",\"taskId\":\"00000000-0000-4000-8000-000000000000\",\"status\":\"COMPLETED\",\"workerId\":\"smoke\"}"
check "POST /api/tasks for an unknown taskId -> 404" code_is 404

# ---- workflow-level retry after the task's retries are exhausted
req POST "/workflow/$WF" '{"x":4}'
WID4=$BODY
poll
T4=$(json_field taskId)
req POST /tasks "{\"workflowInstanceId\":\"$WID4\",\"taskId\":\"$T4\",\"status\":\"FAILED\",\"reasonForIncompletion\":\"f1\",\"workerId\":\"smoke\"}"
poll
T4=$(json_field taskId)
req POST /tasks "{\"workflowInstanceId\":\"$WID4\",\"taskId\":\"$T4\",\"status\":\"FAILED\",\"reasonForIncompletion\":\"f2\",\"workerId\":\"smoke\"}"
sleep 0.5
check "retries exhausted (retryCount 1 on the def) -> workflow FAILED" eval '[[ $(wf_status "$WID4") == FAILED ]]'
req POST "/workflow/$WID4/retry"
check "POST /api/workflow/{id}/retry on a FAILED workflow -> 204" code_is 204
poll
check "workflow retry schedules a new t1 with retryCount 2 (counter keeps growing past the def's retryCount)" eval 'code_is 200 && body_has "\"referenceTaskName\":\"t1\"" && body_has "\"retryCount\":2" && body_has "\"retriedTaskId\":\"$T4\""'
req POST "/workflow/$WID4/retry"
check "POST /api/workflow/{id}/retry on a RUNNING workflow -> 404 (sic)" eval 'code_is 404 && body_has "still running"'
req DELETE "/workflow/$WID4?reason=smoke%20cleanup"
check "terminate the retried workflow -> 200" code_is 200

# ---- cleanup
req DELETE "/metadata/workflow/$WF/1"
check "DELETE /api/metadata/workflow/{name}/{version} -> 200" code_is 200
req DELETE "/metadata/taskdefs/$TASK"
check "DELETE /api/metadata/taskdefs/{name} -> 200" code_is 200

if ((failures > 0)); then
  log "$failures check(s) failed"
  exit 1
fi
log "all checks passed"
