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
