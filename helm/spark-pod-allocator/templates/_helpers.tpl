{{- define "spa.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spa.fullname" -}}
{{- if contains (include "spa.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "spa.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "spa.labels" -}}
app.kubernetes.io/name: {{ include "spa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "spa.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
