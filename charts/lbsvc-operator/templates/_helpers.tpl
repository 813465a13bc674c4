{{/* Chart name, shortened to the 63 characters a label value allows. */}}
{{- define "lbsvc-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects; the chart's name alone when the release is named after it,
so that a release "lbsvc-operator" gives the same names as config/default. */}}
{{- define "lbsvc-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lbsvc-operator.serviceAccountName" -}}
{{- default (include "lbsvc-operator.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The selector labels match config/manager, so a switch between kustomize and Helm keeps the pods. */}}
{{- define "lbsvc-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lbsvc-operator.name" . }}
{{- end }}

{{- define "lbsvc-operator.labels" -}}
{{ include "lbsvc-operator.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
