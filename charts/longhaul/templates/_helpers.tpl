{{/* Names and labels shared by the templates. */}}
{{- define "longhaul.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "longhaul.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "longhaul.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "longhaul.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "longhaul.selectorLabels" -}}
app.kubernetes.io/name: {{ include "longhaul.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "longhaul.labels" -}}
{{ include "longhaul.selectorLabels" . }}
app.kubernetes.io/part-of: longhaul
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* RBAC rules: exactly what the operator reads and writes. */}}
{{- define "longhaul.rules" -}}
- apiGroups: ["longhaul.dev"]
  resources: ["experiments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["longhaul.dev"]
  resources: ["experiments/status"]
  verbs: ["get", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if has "rayjob" .Values.multinodeEngines }}
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create"]
{{- end }}
{{- if has "jobset" .Values.multinodeEngines }}
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get", "list", "watch", "create"]
{{- end }}
{{- end -}}
