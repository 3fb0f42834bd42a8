{{/* Chart name, overridable. */}}
{{- define "gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name: release-chart, or the chart name when the release already contains it. */}}
{{- define "gpu-exporter.fullname" -}}
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

{{/* Labels that select the pods; never change them on upgrade. */}}
{{- define "gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end }}

{{/* Labels on every resource. */}}
{{- define "gpu-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpu-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-exporter
{{- end }}

{{- define "gpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-exporter.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* "true" when the web config turns on TLS (probes and scrapes speak HTTPS). */}}
{{- define "gpu-exporter.tls" -}}
{{- if and .Values.webConfig.enabled (hasKey .Values.webConfig.config "tls_server_config") }}true{{ end }}
{{- end }}

{{/* "true" when the web config has basic auth users (/snapshot needs them, the probes not). */}}
{{- define "gpu-exporter.basicAuth" -}}
{{- if and .Values.webConfig.enabled .Values.webConfig.config.basic_auth_users }}true{{ end }}
{{- end }}

{{/* "true" when the web config demands a client certificate, which kubelet probes cannot
present: only then are the probes TCP checks. */}}
{{- define "gpu-exporter.clientCertRequired" -}}
{{- if include "gpu-exporter.tls" . }}
{{- $auth := get (.Values.webConfig.config.tls_server_config | default dict) "client_auth_type" }}
{{- if has $auth (list "RequireAnyClientCert" "RequireAndVerifyClientCert") }}true{{ end }}
{{- end }}
{{- end }}

{{/* The scrape scheme of a ServiceMonitor / PodMonitor: its own, else the web config's. */}}
{{- define "gpu-exporter.scrapeScheme" -}}
{{- .scheme | default (ternary "https" "http" (eq (include "gpu-exporter.tls" .root) "true")) }}
{{- end }}

{{/* The host directory of the kubelet's pod-resources socket: podResourcesPath where set,
else <kubeletRootDir>/pod-resources; no trailing slash. */}}
{{- define "gpu-exporter.podResourcesPath" -}}
{{- $root := .Values.kubernetes.kubeletRootDir | trimSuffix "/" }}
{{- .Values.kubernetes.podResourcesPath | default (printf "%s/pod-resources" $root) | trimSuffix "/" }}
{{- end }}

{{/* "true" when the pod must run as uid 0: the kubelet socket accepts only root, and
added capabilities reach the effective set of a root process only. */}}
{{- define "gpu-exporter.needsRoot" -}}
{{- if or .Values.kubernetes.enabled .Values.perProcess.enabled .Values.pmu.perfmon }}true{{ end }}
{{- end }}

{{/* The pod's securityContext: values first, then the uid the features need. */}}
{{- define "gpu-exporter.podSecurityContext" -}}
{{- $root := eq (include "gpu-exporter.needsRoot" .) "true" }}
{{- $identity := dict "runAsUser" (ternary 0 10001 $root) "runAsNonRoot" (not $root) }}
{{- toYaml (merge (deepCopy .Values.podSecurityContext) $identity) }}
{{- end }}

{{/* The container's securityContext: values, plus SYS_PTRACE for the per-process preset
and PERFMON for the i915/xe PMU. */}}
{{- define "gpu-exporter.securityContext" -}}
{{- $ctx := deepCopy .Values.securityContext }}
{{- if .Values.perProcess.enabled }}
{{- $caps := $ctx.capabilities | default dict }}
{{- $_ := set $caps "add" (append ($caps.add | default list) "SYS_PTRACE" | uniq) }}
{{- $_ := set $ctx "capabilities" $caps }}
{{- end }}
{{- if .Values.pmu.perfmon }}
{{- $caps := $ctx.capabilities | default dict }}
{{- $_ := set $caps "add" (append ($caps.add | default list) "PERFMON" | uniq) }}
{{- $_ := set $ctx "capabilities" $caps }}
{{- end }}
{{- if not ($ctx.capabilities | default dict).add }}
{{- $_ := unset ($ctx.capabilities | default dict) "add" }}
{{- end }}
{{- toYaml $ctx }}
{{- end }}

{{/* The Prometheus Operator's scrape-side relabelling, shared by ServiceMonitor and
PodMonitor: the node is what an operator acts on, so keep it on every series. */}}
{{- define "gpu-exporter.relabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
  action: replace
{{- with .relabelings }}
{{ toYaml . }}
{{- end }}
{{- end }}


{{/* A probe on one of the two paths the exporter exempts from basic auth. */}}
{{- define "gpu-exporter.probe" -}}
{{- if include "gpu-exporter.clientCertRequired" .root }}
tcpSocket:
  port: metrics
{{- else }}
httpGet:
  path: {{ .path }}
  port: metrics
  scheme: {{ ternary "HTTPS" "HTTP" (eq (include "gpu-exporter.tls" .root) "true") }}
{{- end }}
{{- end }}
