{{/*
The Prometheus Operator objects (ServiceMonitor, PodMonitor, PrometheusRule) need its CRDs. Each
one's `enabled` is auto (rendered when the cluster serves monitoring.coreos.com/v1/<kind>: the CRD
is installed; `helm template` learns it from --api-versions), true (always) or false (never).
Called with (list "<values key>" "<kind>" $); "true" when the object is rendered, else "".
*/}}
{{- define "tierpilot.monitoringObject" -}}
{{- $key := index . 0 -}}{{- $kind := index . 1 -}}{{- $root := index . 2 -}}
{{- $v := toString (index $root.Values $key).enabled -}}
{{- if not (has $v (list "auto" "true" "false")) -}}
{{- fail (printf "%s.enabled: %q is not auto, true or false" $key $v) -}}
{{- end -}}
{{- if or (eq $v "true") (and (eq $v "auto") ($root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind))) -}}
true
{{- end -}}
{{- end -}}
