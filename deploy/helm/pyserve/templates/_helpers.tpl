{{/* The name of every object: the release name, unless it does not already contain the chart's name. */}}
{{- define "pyserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels the Service and the HorizontalPodAutoscaler select pods by; never change across upgrades. */}}
{{- define "pyserve.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pyserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "pyserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* A ConfigMap key for a repository path: keys cannot hold "/", so add_sub/1/model.py is add_sub__1__model.py. */}}
{{- define "pyserve.fileKey" -}}
{{- . | replace "/" "__" -}}
{{- end -}}
