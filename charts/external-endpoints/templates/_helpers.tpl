{{/* Labels of every object and the pods' selector. */}}
{{- define "external-endpoints.labels" -}}
app.kubernetes.io/name: {{ .Release.Name }}
{{- end }}

{{/* The controller's Deployment and pods, whatever the release is named: `external-endpoints
check` and `diff` find the installed controller by this label. Not in the selector, which a
Deployment cannot change. */}}
{{- define "external-endpoints.partOf" -}}
app.kubernetes.io/part-of: external-endpoints
{{- end }}

{{/* Namespace of the Lease. */}}
{{- define "external-endpoints.leaseNamespace" -}}
{{ .Values.lease.namespace | default .Release.Namespace }}
{{- end }}
