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

{{/* Values are quoted wherever they are interpolated: a name such as "null", "on" or "1e3" stays a string. */}}
{{- define "longhaul.selectorLabels" -}}
app.kubernetes.io/name: {{ include "longhaul.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "longhaul.labels" -}}
{{ include "longhaul.selectorLabels" . }}
app.kubernetes.io/part-of: longhaul
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
{{- end -}}

{{/* RBAC rules: exactly what the operator and kopf call (tests/reliability/test_security.py pins the list).
   Experiments: the operator reads one (get); kopf watches them (list, watch) and patches its finalizer and
   annotations (patch) and its progress in status (patch on experiments/status, as does the operator).
   Jobs: created (create; get after 409 AlreadyExists), listed by label, watched by kopf for job events.
   ConfigMaps (the resolved spec): created, read back, listed by label. Events: kopf posts core/v1 Events.
   RayJobs/JobSets: created, read back and listed by the periodic re-sync; never watched.
   Jobs/RayJobs/JobSets: deleted only to stop a run for a spec edit under the annotation
   longhaul.dev/on-spec-change: new-run (ConfigMaps and Experiments are never deleted by the operator).
   Kueue Workloads (kueue: true): listed by job uid to say why a queued stage waits; never written. */}}
{{- define "longhaul.rules" -}}
- apiGroups: ["longhaul.dev"]
  resources: ["experiments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["longhaul.dev"]
  resources: ["experiments/status"]
  verbs: ["patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if has "rayjob" .Values.multinodeEngines }}
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "create", "delete"]
{{- end }}
{{- if has "jobset" .Values.multinodeEngines }}
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get", "list", "create", "delete"]
{{- end }}
{{- if .Values.kueue }}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list"]
{{- end }}
{{- end -}}
