{{/* The chart's name, or nameOverride. */}}
{{- define "dpproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, or the release name (with the
chart's name unless it already contains it). */}}
{{- define "dpproxy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "dpproxy.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "dpproxy.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "dpproxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "dpproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dpproxy
{{- end -}}

{{/* Labels that select the pods: never change them between releases. */}}
{{- define "dpproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dpproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dpproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dpproxy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* dpproxy's configuration file: what the chart must set (paths inside the
pod, the metrics address the probes use, DRA mode) over .Values.config. */}}
{{- define "dpproxy.config" -}}
{{- $set := dict "kubelet" (dict "root" .Values.kubeletRoot) "plugin_dir" (printf "%s/device-plugins" .Values.hostDir) "state_dir" .Values.hostDir "metrics_address" (printf "0.0.0.0:%d" (int .Values.metrics.port)) "container_runtime_endpoint" (.Values.containerRuntimeSocket | default "") -}}
{{- if .Values.dra.enabled -}}
{{- $_ := set $set.kubelet "api" "dra" -}}
{{- $_ := set $set "dra" (dict "driver" (required "dra.driver is required when dra.enabled (a DNS subdomain, e.g. gpu.vendor.com)" .Values.dra.driver) "cdi_dir" .Values.dra.cdiDir) -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite (deepCopy .Values.config) $set) -}}
{{- end -}}
