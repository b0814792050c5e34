{{/*
The tuner's values, checked: a render fails with one line naming the keys.
- tuner.dryRun: true (observe only: every write a server-side dry-run) or false (live).
- tuner.storage.type: ephemeral (SQLite on an emptyDir: needs nothing, every pod starts a fresh
  study), sqlite (on a PersistentVolumeClaim: one replica) or postgresql (shared by the replicas).
  Live tuning needs a persistent study: with ephemeral a new leader would explore the live fleet again.
*/}}

{{/* "true" when the tuner only plans (tuner.dryRun), else "". */}}
{{- define "tierpilot.dryRun" -}}
{{- $v := toString .Values.tuner.dryRun -}}
{{- if not (has $v (list "true" "false")) -}}
{{- fail (printf "tuner.dryRun: %q is not true or false" $v) -}}
{{- end -}}
{{- if eq $v "true" -}}true{{- end -}}
{{- end -}}

{{/* Where the study lives when the tuner is on: ephemeral, sqlite or postgresql ("" when it is off). */}}
{{- define "tierpilot.study" -}}
{{- $type := toString .Values.tuner.storage.type -}}
{{- if not (has $type (list "ephemeral" "sqlite" "postgresql")) -}}
{{- fail (printf "tuner.storage.type: %q is not ephemeral, sqlite or postgresql" $type) -}}
{{- end -}}
{{- if and .Values.postgresql.enabled (ne $type "postgresql") -}}
{{- fail "postgresql.enabled=true holds the study only with tuner.storage.type=postgresql" -}}
{{- end -}}
{{- $dryRun := include "tierpilot.dryRun" . -}}
{{- if .Values.tuner.enabled -}}
{{- if and (not $dryRun) (eq $type "ephemeral") -}}
{{- fail "tuner.dryRun=false needs a persistent study: set tuner.storage.type to postgresql (or sqlite with replicaCount: 1); an ephemeral study restarts with every new leader, which explores the live fleet again" -}}
{{- end -}}
{{- $type -}}
{{- end -}}
{{- end -}}

{{/* The SQLite study file (storage ephemeral or sqlite), on the volume mounted at /var/lib/tierpilot. */}}
{{- define "tierpilot.sqliteStudy" -}}sqlite:////var/lib/tierpilot/tierpilot.db{{- end -}}

{{/* The Secret holding the PostgreSQL DSN ("" unless the study is in PostgreSQL). */}}
{{- define "tierpilot.storageSecret" -}}
{{- if eq (include "tierpilot.study" .) "postgresql" -}}
{{- if .Values.postgresql.enabled -}}
{{- printf "%s-postgresql" (include "tierpilot.fullname" .) -}}
{{- else if .Values.tuner.storage.existingSecret -}}
{{- .Values.tuner.storage.existingSecret -}}
{{- else -}}
{{- fail "tuner.storage.type=postgresql needs tuner.storage.existingSecret (a Secret with the DSN) or postgresql.enabled=true; or use tuner.storage.type=sqlite with replicaCount: 1" -}}
{{- end -}}
{{- end -}}
{{- end -}}


{{/* What the tuner may write: none (observe: shadow mode, or tuner off), or tuner.apply (hot, all). */}}
{{- define "tierpilot.writes" -}}
{{- $apply := toString .Values.tuner.apply -}}
{{- if not (has $apply (list "none" "hot" "all")) -}}
{{- fail (printf "tuner.apply: %q is not none, hot or all" $apply) -}}
{{- end -}}
{{- if and .Values.tuner.enabled (not (include "tierpilot.dryRun" .)) -}}
{{- if not .Values.actuation.targets -}}
{{- fail "tuner.dryRun=false needs actuation.targets (the objects the tuner changes; values.yaml has an example)" -}}
{{- end -}}
{{- $apply -}}
{{- else -}}none{{- end -}}
{{- end -}}

{{/* The tuner's mode for the agent ($TIERPILOT_TUNER__MODE): shadow while observing, live otherwise. */}}
{{- define "tierpilot.tunerMode" -}}
{{- if include "tierpilot.dryRun" . }}shadow{{ else }}live{{ end -}}
{{- end -}}

{{/* "true" when the tuner may patch the target `.t` under writes `.writes` (the router's knobs under hot). */}}
{{- define "tierpilot.writable" -}}
{{- $routerKinds := dict "router-configmap" (list "router") "vllm-router-args" (list "router" "router_temperature" "kv_penalty_host" "kv_penalty_external") "hyperpod-iec" (list "router") -}}
{{- if eq .writes "all" -}}true
{{- else if eq .writes "hot" -}}
{{- $owned := get $routerKinds .t.kind -}}
{{- if and $owned .t.knobs -}}
{{- range .t.knobs }}{{ if has . $owned }}true{{ end }}{{ end -}}
{{- else if $owned -}}true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when some target may be patched (then Events are recorded). */}}
{{- define "tierpilot.anyWritable" -}}
{{- $writes := include "tierpilot.writes" . -}}
{{- range .Values.actuation.targets }}{{ if include "tierpilot.writable" (dict "t" . "writes" $writes) }}true{{ end }}{{ end -}}
{{- end -}}

{{/* tuner.apply, checked (the render fails naming the key). */}}
{{- define "tierpilot.applyValue" -}}
{{- $_ := include "tierpilot.writes" . -}}{{ toString .Values.tuner.apply }}
{{- end -}}
