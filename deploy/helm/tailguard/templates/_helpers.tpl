{{/* The chart's name, at most 63 characters. */}}
{{- define "tailguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's objects' name: the release name, with the chart's unless it holds it. */}}
{{- define "tailguard.fullname" -}}
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

{{- define "tailguard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tailguard.labels" -}}
helm.sh/chart: {{ include "tailguard.chart" . }}
{{ include "tailguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tailguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tailguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tailguard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the preStop sleep, then the drain of [timeouts] shutdown_ms
(rounded up to whole seconds), then 5 s for the access log's flush and exit, as the systemd
unit's TimeoutStopSec (15 s) is the default drain (10 s) plus 5. Below that Kubernetes kills
a gateway that is still draining.
*/}}
{{- define "tailguard.terminationGracePeriodSeconds" -}}
{{- $drain := div (add (int .Values.gateway.shutdownMs) 999) 1000 }}
{{- add (int .Values.gateway.preStopSeconds) $drain 5 }}
{{- end }}

{{/*
Values the chart refuses, each with the reason. Included by every template that renders one
of them.
*/}}
{{- define "tailguard.validate" -}}
{{- if not (has .Values.kind (list "Deployment" "DaemonSet")) }}
{{- fail (printf "kind: %q is neither Deployment nor DaemonSet" .Values.kind) }}
{{- end }}
{{- if not (has .Values.overload.mode (list "adaptive" "gozero" "off")) }}
{{- fail (printf "overload.mode: %q is none of adaptive, gozero, off" .Values.overload.mode) }}
{{- end }}
{{- $threshold := float64 .Values.overload.cpuThreshold }}
{{- if or (le $threshold 0.0) (gt $threshold 1.0) }}
{{- fail (printf "overload.cpuThreshold: %v is not a CPU share in (0, 1]" .Values.overload.cpuThreshold) }}
{{- end }}
{{- if .Values.autoscaling.enabled }}
{{- if eq .Values.kind "DaemonSet" }}
{{- fail "autoscaling.enabled: a DaemonSet runs one gateway per node and cannot be autoscaled; use kind: Deployment" }}
{{- end }}
{{- if ne .Values.overload.mode "off" }}
{{- $target := float64 .Values.autoscaling.targetCPUUtilizationPercentage }}
{{- $scalesAt := mulf $target (addf 1.0 (float64 .Values.autoscaling.tolerance)) }}
{{- if ge $scalesAt (mulf $threshold 100.0) }}
{{- fail (printf "autoscaling.targetCPUUtilizationPercentage (%v) must be below the shedder's CPU threshold overload.cpuThreshold (%v, i.e. %v%%) with the autoscaler's tolerance (autoscaling.tolerance %v) to spare: the autoscaler scales out only above %v%% CPU, and a gateway that sheds holds its CPU just under %v%%, so it would never scale out. Lower the target (80 under a threshold of 0.9) or raise the threshold." .Values.autoscaling.targetCPUUtilizationPercentage .Values.overload.cpuThreshold (mulf $threshold 100.0) .Values.autoscaling.tolerance $scalesAt (mulf $threshold 100.0)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if regexMatch "(?m)^[ \t]*\\[(metrics|timeouts|overload)\\][ \t]*(#.*)?$" .Values.config }}
{{- fail "config: [metrics], [timeouts] and [overload] are written by the chart (gateway.metricsPort, gateway.shutdownMs and gateway.timeouts, overload.*); remove them from config" }}
{{- end }}
{{- if and .Values.etcd.enabled (not .Values.etcd.endpoints) }}
{{- fail "etcd.endpoints: etcd.enabled needs at least one endpoint (http://... or https://...)" }}
{{- end }}
{{- end }}
