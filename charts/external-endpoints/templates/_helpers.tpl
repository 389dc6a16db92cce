{{/* Labels of every object and the pods' selector. */}}
{{- define "external-endpoints.labels" -}}
app.kubernetes.io/name: {{ .Release.Name }}
{{- end }}

{{/* On the controller's Deployment, whatever the release is named: `external-endpoints check`
and `diff` find the installed controller by this label. Not on the pods (the PodDisruptionBudget
and the metrics Service select them by the labels above) nor in the selector, which a Deployment
cannot change. */}}
{{- define "external-endpoints.partOf" -}}
app.kubernetes.io/part-of: external-endpoints
{{- end }}

{{/* Namespace of the Lease. */}}
{{- define "external-endpoints.leaseNamespace" -}}
{{ .Values.lease.namespace | default .Release.Namespace }}
{{- end }}
