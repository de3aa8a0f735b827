{{/* Name of the chart, or nameOverride. */}}
{{- define "moongate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or fullnameOverride. */}}
{{- define "moongate.fullname" -}}
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

{{- define "moongate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "moongate.labels" -}}
helm.sh/chart: {{ include "moongate.chart" . }}
{{ include "moongate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Stable labels only: selectors never change across upgrades. */}}
{{- define "moongate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "moongate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "moongate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "moongate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "moongate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the control port's certificate. */}}
{{- define "moongate.tlsSecret" -}}
{{- if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "moongate.fullname" .) }}
{{- else }}
{{- .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{- define "moongate.peersService" -}}
{{- printf "%s-peers" (include "moongate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The container's security context: the user's, else non-root and locked down, or root
     with the RDMA capabilities (IPC_LOCK works for root only) when RDMA is on. */}}
{{- define "moongate.containerSecurityContext" -}}
{{- if .Values.containerSecurityContext }}
{{- toYaml .Values.containerSecurityContext }}
{{- else if or .Values.rdma.enabled .Values.processMemory.enabled }}
runAsUser: 0
runAsNonRoot: false
privileged: {{ and .Values.rdma.enabled .Values.rdma.hostDevMount }}
allowPrivilegeEscalation: {{ and .Values.rdma.enabled .Values.rdma.hostDevMount }}
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
  add:
    {{- if .Values.rdma.enabled }}
    {{- toYaml .Values.rdma.capabilities | nindent 4 }}
    {{- end }}
    {{- if .Values.processMemory.enabled }}
    - SYS_PTRACE
    {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- else }}
runAsUser: 65532
runAsGroup: 65532
runAsNonRoot: true
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{/*
maxSurge of the update: 0 whenever two daemons of one node would share something of the node's —
its ports (hostNetwork), its shm directory or its socket directory (hostPath). A second daemon on
one shm directory refuses to start (the first holds the directory's lock), so a surge there
would only stall the rollout.
*/}}
{{- define "moongate.maxSurge" -}}
{{- if or .Values.hostNetwork .Values.shm.hostPath .Values.socket.hostPath -}}
0
{{- else -}}
{{ .Values.updateStrategy.maxSurge }}
{{- end -}}
{{- end -}}
