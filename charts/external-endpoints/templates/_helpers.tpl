{{/* Labels of every object and the pods' selector. */}}
{{- define "external-endpoints.labels" -}}
app.kubernetes.io/name: {{ .Release.Name }}
{{- end }}

{{/* Namespace of the Lease. */}}
{{- define "external-endpoints.leaseNamespace" -}}
{{ .Values.lease.namespace | default .Release.Namespace }}
{{- end }}
