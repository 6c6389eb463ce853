{{- define "kvloop.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvloop.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: kvloop-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvloop
{{- end -}}

{{- define "kvloop.selectorLabels" -}}
app.kubernetes.io/name: kvloop-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvloop.serviceAccountName" -}}
{{- default (include "kvloop.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "kvloop.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- /* "true" when a watchNamespaces entry is a kopf glob pattern, not one namespace's name. */}}
{{- define "kvloop.isPattern" -}}
{{- if regexMatch "[*?!,]" . }}true{{ end -}}
{{- end -}}

{{- define "kvloop.hasPatterns" -}}
{{- range .Values.operator.watchNamespaces }}{{ include "kvloop.isPattern" . }}{{ end -}}
{{- end -}}
