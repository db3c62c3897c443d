{{/* The objects' name: the release name when it contains "sidecar", else <release>-sidecar. */}}
{{- define "sidecar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "sidecar" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-sidecar" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels that select the pods. */}}
{{- define "sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: sidecar
{{- end -}}

{{/* The labels of every object: the selector's and more. */}}
{{- define "sidecar.labels" -}}
{{ include "sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The sidecar image reference. */}}
{{- define "sidecar.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- if .Values.image.digest -}}{{- $ref = printf "%s@%s" $ref .Values.image.digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* Whether the sidecar runs the embedded NATS server. */}}
{{- define "sidecar.embeddedNATS" -}}
{{- if not .Values.nats.url -}}true{{- end -}}
{{- end -}}

{{/* Conductor's API URL. */}}
{{- define "sidecar.conductorURL" -}}
{{- if .Values.conductor.url -}}
{{- .Values.conductor.url -}}
{{- else if .Values.conductor.inPod.enabled -}}
http://localhost:8080/api
{{- else if not .Values.conductor.urlSecret.name -}}
{{- fail "conductor.url is required (Conductor's API, e.g. http://conductor.conductor.svc:8080/api), or conductor.urlSecret for a URL with credentials, or conductor.inPod.enabled for a Conductor in the sidecar's pod" -}}
{{- end -}}
{{- end -}}

{{/* The Secret with the tokens file. */}}
{{- define "sidecar.tokensSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-api-tokens" (include "sidecar.fullname" .)) -}}
{{- end -}}

{{/*
A Go duration of hours, minutes and seconds ("90s", "1m30s", "2h") in
seconds; the schema allows no other form.
*/}}
{{- define "sidecar.seconds" -}}
{{- $d := toString . -}}
{{- $h := regexFind "[0-9]+h" $d | trimSuffix "h" | default "0" | atoi -}}
{{- $m := regexFind "[0-9]+m" $d | trimSuffix "m" | default "0" | atoi -}}
{{- $s := regexFind "[0-9]+s" $d | trimSuffix "s" | default "0" | atoi -}}
{{- add (mul $h 3600) (mul $m 60) $s -}}
{{- end -}}

{{/* The pod's grace period: config.shutdownGrace + 60s, or the value set (not less). */}}
{{- define "sidecar.terminationGracePeriodSeconds" -}}
{{- $need := add (include "sidecar.seconds" .Values.config.shutdownGrace | atoi) 60 -}}
{{- $set := .Values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $set -}}
{{- $need -}}
{{- else if lt (int $set) (int $need) -}}
{{- fail (printf "terminationGracePeriodSeconds %v is less than config.shutdownGrace (%s) + 60s = %ds: running steps would be killed before they are handed back" $set .Values.config.shutdownGrace $need) -}}
{{- else -}}
{{- int $set -}}
{{- end -}}
{{- end -}}

{{/*
GOMEMLIMIT: goMemLimitPercent of resources.limits.memory, in MiB; empty
when either is unset. The schema allows integer quantities with a binary
or decimal suffix.
*/}}
{{- define "sidecar.goMemLimit" -}}
{{- $limit := "" -}}
{{- with .Values.resources.limits -}}{{- $limit = toString (.memory | default "") -}}{{- end -}}
{{- if and $limit .Values.goMemLimitPercent -}}
{{- $bytes := include "sidecar.bytes" $limit | atoi -}}
{{- $mib := div (div (mul $bytes .Values.goMemLimitPercent) 100) 1048576 -}}
{{- if lt (int64 $mib) 1 -}}
{{- fail (printf "resources.limits.memory %s is too small for GOMEMLIMIT (%d%% of it is under 1MiB)" $limit (int .Values.goMemLimitPercent)) -}}
{{- end -}}
{{- printf "%dMiB" (int64 $mib) -}}
{{- end -}}
{{- end -}}

{{/* A memory quantity (an integer with an optional suffix K, M, G, T, Ki, Mi, Gi, Ti, as the schema allows) in bytes. */}}
{{- define "sidecar.bytes" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+" $q -}}
{{- $unit := trimPrefix $num $q -}}
{{- $scale := get (dict "" 1 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776) $unit -}}
{{- mul (atoi $num) $scale -}}
{{- end -}}

{{/* A CPU quantity in millicores ("500m", "2", "1.5"); -1 for a form it does not read (the schema allows a few more). */}}
{{- define "sidecar.millicores" -}}
{{- $q := toString . -}}
{{- if regexMatch "^[0-9]+m$" $q -}}
{{- trimSuffix "m" $q -}}
{{- else if regexMatch "^[0-9]+(\\.[0-9]{1,3})?$" $q -}}
{{- $parts := splitList "." $q -}}
{{- $frac := "" -}}
{{- if gt (len $parts) 1 -}}{{- $frac = index $parts 1 -}}{{- end -}}
{{- add (mul (atoi (index $parts 0)) 1000) (atoi (printf "%s%s" $frac (repeat (sub 3 (len $frac) | int) "0"))) -}}
{{- else -}}
-1
{{- end -}}
{{- end -}}

{{/* Fails when a request is above its limit (name: the values' path), which Kubernetes would refuse only when it makes the pod. */}}
{{- define "sidecar.requestsWithinLimits" -}}
{{- $name := index . 0 -}}
{{- $r := index . 1 | default dict -}}
{{- $req := $r.requests | default dict -}}
{{- $lim := $r.limits | default dict -}}
{{- if and $req.memory $lim.memory -}}
{{- if gt (include "sidecar.bytes" $req.memory | atoi) (include "sidecar.bytes" $lim.memory | atoi) -}}
{{- fail (printf "%s.requests.memory %v is above %s.limits.memory %v: Kubernetes refuses such a pod; raise the limit or lower the request" $name $req.memory $name $lim.memory) -}}
{{- end -}}
{{- end -}}
{{- if and $req.cpu $lim.cpu -}}
{{- $rc := include "sidecar.millicores" $req.cpu | atoi -}}
{{- $lc := include "sidecar.millicores" $lim.cpu | atoi -}}
{{- if and (ge $rc 0) (ge $lc 0) (gt $rc $lc) -}}
{{- fail (printf "%s.requests.cpu %v is above %s.limits.cpu %v: Kubernetes refuses such a pod; raise the limit or lower the request" $name $req.cpu $name $lim.cpu) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The startup probe's failureThreshold at 5s a period: 5 minutes, and longer than nats.startTimeout + 60s. */}}
{{- define "sidecar.startupFailureThreshold" -}}
{{- $wait := 0 -}}
{{- if .Values.nats.url -}}{{- $wait = include "sidecar.seconds" .Values.nats.startTimeout | atoi -}}{{- end -}}
{{- max 60 (add (div (add $wait 60) 5) 1) -}}
{{- end -}}

{{/* Values that the schema cannot check: fail with what to change. */}}
{{- define "sidecar.validate" -}}
{{- include "sidecar.requestsWithinLimits" (list "resources" .Values.resources) -}}
{{- include "sidecar.requestsWithinLimits" (list "conductor.inPod.resources" .Values.conductor.inPod.resources) -}}
{{- if and (not .Values.nats.url) (gt (int .Values.replicaCount) 1) -}}
{{- fail (printf "replicaCount %d needs an external NATS cluster (nats.url): the embedded NATS store is a ReadWriteOnce volume that one sidecar may open" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and (not .Values.nats.url) (gt (int .Values.nats.replicas) 1) -}}
{{- fail "nats.replicas above 1 needs an external NATS cluster (nats.url)" -}}
{{- end -}}
{{- if and .Values.nats.url (not .Values.nats.passwordSecret.name) (not .Values.nats.insecureNoAuth) -}}
{{- fail "nats.url needs credentials: nats.passwordSecret.name (a Secret with the password of nats.user), or nats.insecureNoAuth: true" -}}
{{- end -}}
{{- if and .Values.auth.existingSecret .Values.auth.principals -}}
{{- fail "set auth.principals or auth.existingSecret, not both" -}}
{{- end -}}
{{- if and (not .Values.auth.existingSecret) (not .Values.auth.principals) -}}
{{- fail "auth.principals or auth.existingSecret is required: the API listens on all interfaces in a pod, and serve refuses that without authentication (make a token with `sidecar token new`)" -}}
{{- end -}}
{{- if and .Values.tls.clientCASecretName (not .Values.tls.secretName) -}}
{{- fail "tls.clientCASecretName needs tls.secretName: client certificates are verified on a TLS listener" -}}
{{- end -}}
{{- if and .Values.conductor.url (regexMatch "^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@" .Values.conductor.url) -}}
{{- fail "conductor.url holds a password: it would be in a ConfigMap; put the URL in a Secret of yours and name it in conductor.urlSecret" -}}
{{- end -}}
{{- if and .Values.conductor.urlSecret.name (or .Values.conductor.url .Values.conductor.inPod.enabled) -}}
{{- fail "conductor.urlSecret names Conductor's URL: leave conductor.url empty and conductor.inPod off" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $p := .Values.auth.principals -}}
{{- range $field := list "name" "tokenSha256" "certCommonName" -}}
{{- with get $p $field -}}
{{- $key := printf "%s=%v" $field . -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "auth.principals: the %s %v is given twice: serve refuses a tokens file that names a principal, a token or a certificate twice" $field .) -}}
{{- end -}}
{{- $_ := set $seen $key true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.store.postgresURL (regexMatch "^postgres(ql)?://[^/@]*:[^/@]*@" .Values.store.postgresURL) -}}
{{- fail "store.postgresURL holds a password: keep it out of the URL (it would be in a ConfigMap) and put it in store.passwordSecret" -}}
{{- end -}}
{{- with .Values.podDisruptionBudget.minAvailable -}}
{{- if and (gt (int $.Values.replicaCount) 1) (ge (int .) (int $.Values.replicaCount)) -}}
{{- fail (printf "podDisruptionBudget.minAvailable %d is not below replicaCount %d: no pod could ever be evicted, so every node drain would block; at most replicaCount - 1" (int .) (int $.Values.replicaCount)) -}}
{{- end -}}
{{- end -}}
{{- $own := include "sidecar.configData" . | fromYaml -}}
{{- range $k, $v := .Values.config.extra -}}
{{- if or (hasKey $own $k) (has $k (list "SIDECAR_WORKER_ID" "SIDECAR_LISTEN" "SIDECAR_TOKENS_FILE" "SIDECAR_METRICS_LISTEN" "SIDECAR_DATA_DIR" "SIDECAR_NATS_URL" "SIDECAR_NATS_PASSWORD_FILE" "SIDECAR_STORE" "SIDECAR_TLS_CERT" "SIDECAR_TLS_KEY" "SIDECAR_CLIENT_CA" "SIDECAR_CONDUCTOR_URL")) -}}
{{- fail (printf "config.extra.%s is set by the chart from its own values (docs/helm.md, \"Values\"): set that value; config.extra takes serve's other settings" $k) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .Values.otel.extra -}}
{{- if has $k (list "OTEL_EXPORTER_OTLP_ENDPOINT" "OTEL_EXPORTER_OTLP_PROTOCOL" "OTEL_SERVICE_NAME" "OTEL_EXPORTER_OTLP_HEADERS") -}}
{{- fail (printf "otel.extra.%s is set by the chart from otel's own values (docs/helm.md, \"Tracing\"): set that value" $k) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .Values.config.extra -}}
{{- if regexMatch "^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@" (toString $v) -}}
{{- fail (printf "config.extra.%s holds a password in a URL: config.extra goes into a ConfigMap; put the password in a Secret (the chart's passwordSecret and passfileSecret values)" $k) -}}
{{- end -}}
{{- if regexMatch "(PASSWORD|TOKEN|SECRET)$" $k -}}
{{- fail (printf "config.extra.%s looks like a secret: config.extra goes into a ConfigMap; use the chart's Secret values (or a file in a Secret and the matching _FILE setting)" $k) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.taskProxy.enabled (not .Values.taskProxy.tokenSecret.name) (not .Values.taskProxy.insecureNoAuth) -}}
{{- fail "taskProxy.enabled needs taskProxy.tokenSecret.name (a Secret with the tokens workers send), or taskProxy.insecureNoAuth: true when Conductor's own authentication (the workers' headers are forwarded) or taskProxy.from keeps others out: the proxy listens on all interfaces of the pod" -}}
{{- end -}}
{{- if and .Values.taskProxy.adopt (not .Values.taskProxy.enabled) -}}
{{- fail "taskProxy.adopt needs taskProxy.enabled: the workers of adopted definitions poll through the task proxy, which gates their tasks" -}}
{{- end -}}
{{- with .Values.retention -}}
{{- if and (not .finished) (or .archive .store .passfileSecret.name .natsPasswordSecret.name) -}}
{{- fail "retention.archive, .store, .passfileSecret and .natsPasswordSecret need retention.finished (e.g. 720h)" -}}
{{- end -}}
{{- if .finished -}}
{{- if not .archive -}}
{{- fail "retention.finished needs retention.archive (s3://bucket/prefix or file:///dir): runs leave hot state only once archived" -}}
{{- end -}}
{{- if hasPrefix "file://" .archive -}}
{{- if $.Values.nats.url -}}
{{- fail (printf "retention.archive %s: the pods of an external NATS have no volume of the chart's to keep an archive on; use s3://bucket/prefix" .archive) -}}
{{- end -}}
{{- if not (hasPrefix "file:///var/lib/sidecar/" .archive) -}}
{{- fail (printf "retention.archive %s is off the data volume (the root file system is read-only, /tmp goes with the pod): give a directory under it, file:///var/lib/sidecar/archive, or use s3://bucket/prefix" .archive) -}}
{{- end -}}
{{- end -}}
{{- if and $.Values.store.postgresURL (not .store) -}}
{{- fail "retention.finished with store.postgresURL needs retention.store: postgres://RETENTION_ROLE@host:5432/database, the role that may remove runs (docs/postgres.md, Retention)" -}}
{{- end -}}
{{- if and .store (not $.Values.store.postgresURL) -}}
{{- fail "retention.store is for store.postgresURL; on NATS retention uses the NATS user sidecar-retention (retention.natsPasswordSecret)" -}}
{{- end -}}
{{- if and .store (regexMatch "^postgres(ql)?://[^/@]*:[^/@]*@" .store) -}}
{{- fail "retention.store holds a password: keep it out of the URL (it would be in a ConfigMap) and put it in retention.passfileSecret" -}}
{{- end -}}
{{- if and .store (not .passfileSecret.name) -}}
{{- fail "retention.store needs retention.passfileSecret: a pgpass file with the passwords of both roles" -}}
{{- end -}}
{{- if and .passfileSecret.name $.Values.store.passwordSecret.name -}}
{{- fail "retention.passfileSecret replaces store.passwordSecret: PGPASSWORD would be used for the retention role too; put both roles' passwords in the pgpass file" -}}
{{- end -}}
{{- if and $.Values.nats.url (not .natsPasswordSecret.name) -}}
{{- fail "retention.finished with nats.url needs retention.natsPasswordSecret: the password of the NATS user sidecar-retention, the only one that may remove runs" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $_ := include "sidecar.conductorURL" . -}}
{{- end -}}
