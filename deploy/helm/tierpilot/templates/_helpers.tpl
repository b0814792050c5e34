{{/* Names and labels. */}}
{{- define "tierpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tierpilot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "tierpilot.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "tierpilot.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tierpilot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tierpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: tierpilot
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The agent pods. */}}
{{- define "tierpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tierpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "tierpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tierpilot.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tierpilot.discoveryNamespace" -}}
{{- default .Release.Namespace .Values.discovery.kubernetes.namespace -}}
{{- end -}}

{{- define "tierpilot.leaseName" -}}
{{- printf "%s-leader" (include "tierpilot.fullname" .) -}}
{{- end -}}

{{/* Is a Lease needed: the tuner elects a leader, or only the leader exports the fleet series. */}}
{{- define "tierpilot.leaseNeeded" -}}
{{- if and .Values.actuation.leaderElection (or .Values.tuner.enabled (eq .Values.export.fleet "leader")) -}}true{{- end -}}
{{- end -}}

{{/* Sharded direct scrape: shard.count > 1 replicas of a StatefulSet split the pods (the ordinal is the shard). */}}
{{- define "tierpilot.sharded" -}}
{{- if gt (int .Values.shard.count) 1 -}}true{{- end -}}
{{- end -}}

{{/* How many agent pods: one per shard when sharded, else replicaCount. */}}
{{- define "tierpilot.replicas" -}}
{{- if include "tierpilot.sharded" . -}}{{ int .Values.shard.count }}{{- else -}}{{ int .Values.replicaCount }}{{- end -}}
{{- end -}}

{{/* The headless Service that gives every shard a stable DNS name for its peers. */}}
{{- define "tierpilot.peersService" -}}
{{- printf "%s-peers" (include "tierpilot.fullname" .) -}}
{{- end -}}

{{/* The Secret holding the replicas' shared bearer token for /window and /kv/sketch. */}}
{{- define "tierpilot.peerTokenSecret" -}}
{{- default (printf "%s-peer-token" (include "tierpilot.fullname" .)) .Values.shard.tokenSecret.name -}}
{{- end -}}

{{/*
The Role rules over the actuation targets, derived as agent/k8s/rbac.py does: get/patch/watch on
each target the tuner may write (tierpilot.writes: tuner.apply when live, none while observing) by
name, get/patch on each workload a change to it restarts; get only on a target it may not write;
get on each ConfigMap/Secret named in a target's env_sources (what its pods take through envFrom/valueFrom).
tests/test_helm_chart.py compares the result with required_rules() for every target kind.
*/}}
{{- define "tierpilot.targetRules" -}}
{{- $kinds := dict "deployment-env" (list "apps" "deployments") "lmcache-configmap" (list "" "configmaps") "router-configmap" (list "" "configmaps") "curvine-configmap" (list "" "configmaps") "hyperpod-iec" (list "inference.sagemaker.aws.amazon.com" "inferenceendpointconfigs") "vllm-router-args" (list "apps" "deployments") "lmcache-mp-args" (list "apps" "deployments") "vllm-offload-args" (list "apps" "deployments") "vllm-tiering-args" (list "apps" "deployments") -}}
{{- $workloads := dict "Deployment" (list "apps" "deployments") "StatefulSet" (list "apps" "statefulsets") -}}
{{- $sources := dict "ConfigMap" "configmaps" "Secret" "secrets" -}}
{{- $writes := include "tierpilot.writes" . -}}
{{- range .Values.actuation.targets }}
{{- $r := get $kinds .kind | required (printf "actuation.targets: unknown kind %q (valid: %s)" .kind (keys $kinds | sortAlpha | join ", ")) }}
{{- range .env_sources }}
{{- $s := get $sources (.kind | default "ConfigMap") | required (printf "actuation.targets env_sources: unknown kind %q (valid: ConfigMap, Secret)" .kind) }}
- apiGroups: [""]
  resources: [{{ $s }}]
  resourceNames: [{{ .name | quote }}]
  verbs: [get]
{{- end }}
- apiGroups: [{{ index $r 0 | quote }}]
  resources: [{{ index $r 1 }}]
  resourceNames: [{{ .name | quote }}]
{{- if not (include "tierpilot.writable" (dict "t" . "writes" $writes)) }}
  verbs: [get]
{{- else }}
  verbs: [get, patch, watch]
{{- range .restart }}
{{- $w := get $workloads .kind | required (printf "actuation.targets restart: unknown kind %q (valid: Deployment, StatefulSet)" .kind) }}
- apiGroups: [{{ index $w 0 | quote }}]
  resources: [{{ index $w 1 }}]
  resourceNames: [{{ .name | quote }}]
  verbs: [get, patch]
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
source.type=prometheus: the agent reads the fleet from a query API instead of scraping the pods.
Validates the source values (fails the render with a message naming the key) and returns "true".
*/}}
{{- define "tierpilot.promSource" -}}
{{- $s := .Values.source -}}
{{- if not (has $s.type (list "direct" "prometheus")) -}}
{{- fail (printf "source.type: %q is not direct or prometheus" $s.type) -}}
{{- end -}}
{{- if eq $s.type "prometheus" -}}
{{- $p := $s.prometheus -}}
{{- if not $p.url -}}
{{- fail "source.type=prometheus needs source.prometheus.url (the query API, e.g. http://prometheus.monitoring:9090)" -}}
{{- end -}}
{{- if not (regexMatch "^https?://[^/?#]+" $p.url) -}}
{{- fail (printf "source.prometheus.url: %q must start with http:// or https:// and name a host" $p.url) -}}
{{- end -}}
{{- if gt (int .Values.shard.count) 1 -}}
{{- fail "shard.count > 1 is sharded direct scraping; source.type=prometheus reads the whole fleet from the query API: set shard.count: 1" -}}
{{- end -}}
{{- $roles := list "vllm" "lmcache" "curvine-master" "curvine-worker" "curvine-fuse" "router" -}}
{{- range $role, $selector := ($p.roles | default dict) -}}
{{- if not (has $role $roles) -}}
{{- fail (printf "source.prometheus.roles: %q is not a role (%s)" $role (join ", " $roles)) -}}
{{- end -}}
{{- if not (kindIs "string" $selector) -}}
{{- fail (printf "source.prometheus.roles.%s: give a series selector string, e.g. 'job=\"%s\"'" $role $role) -}}
{{- end -}}
{{- end -}}
{{- if not (and (or (kindIs "float64" $p.timeoutSeconds) (kindIs "int64" $p.timeoutSeconds)) (gt (float64 $p.timeoutSeconds) 0.0)) -}}
{{- fail (printf "source.prometheus.timeoutSeconds: %v is not a number of seconds above 0" $p.timeoutSeconds) -}}
{{- end -}}
{{- if not (has $p.aggregate (list "server" "agent")) -}}
{{- fail (printf "source.prometheus.aggregate: %q is not server or agent" $p.aggregate) -}}
{{- end -}}
{{- if and $p.bearerToken.secretName $p.basicAuth.secretName -}}
{{- fail "source.prometheus: give bearerToken.secretName or basicAuth.secretName, not both" -}}
{{- end -}}
{{- if ne (not $p.basicAuth.username) (not $p.basicAuth.secretName) -}}
{{- fail "source.prometheus.basicAuth needs both username and secretName (the Secret holding the password)" -}}
{{- end -}}
{{- if and $p.tls.ca.secretName $p.tls.ca.configMapName -}}
{{- fail "source.prometheus.tls.ca: give secretName or configMapName, not both" -}}
{{- end -}}
{{- if and .Values.kvEvents.enabled (not (get (.Values.discovery.kubernetes.roles | default dict) "vllm")) -}}
{{- fail "kvEvents.enabled with source.type=prometheus finds the KV-event endpoints on the vLLM pods: set discovery.kubernetes.roles.vllm.selector (or kvEvents.enabled=false)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The query API's port (source.prometheus.url's, else the scheme's), for the NetworkPolicy. */}}
{{- define "tierpilot.queryApiPort" -}}
{{- $u := urlParse .Values.source.prometheus.url -}}
{{- $p := splitList ":" $u.host | last -}}
{{- if and (contains ":" $u.host) (regexMatch "^[0-9]+$" $p) -}}{{ $p }}{{- else if eq $u.scheme "https" -}}443{{- else -}}80{{- end -}}
{{- end -}}

{{/* Where the query API's credentials are mounted (projected keys: kubelet's swap on rotation is seen). */}}
{{- define "tierpilot.promSecretsDir" -}}/var/run/secrets/tierpilot{{- end -}}

{{/*
The API server's addresses as /32 CIDRs (a JSON list): networkPolicy.apiServer.cidrs, else the
`kubernetes` Endpoints in `default` looked up at install (empty under `helm template`, or without
read access to it: then the egress to the API server's ports is open to anywhere, and NOTES says so).
*/}}
{{- define "tierpilot.apiServerCidrs" -}}
{{- $cidrs := .Values.networkPolicy.apiServer.cidrs -}}
{{- if not $cidrs -}}
{{- $ep := lookup "v1" "Endpoints" "default" "kubernetes" -}}
{{- range ($ep.subsets | default list) }}{{ range (.addresses | default list) }}{{ $cidrs = append $cidrs (printf "%s/32" .ip) }}{{ end }}{{ end -}}
{{- end -}}
{{- toJson ($cidrs | default list) -}}
{{- end -}}
