{{- define "spa.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spa.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "spa.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "spa.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "spa.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "spa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "spa.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* The service account the pod runs as (created by the chart or given). */ -}}
{{- define "spa.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "spa.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */ -}}
{{- define "spa.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- /* The configuration file the service reads (its own snake_case keys), with extraConfig merged over it. */ -}}
{{- define "spa.config" -}}
{{- $a := .Values.allocation -}}
{{- $k := .Values.kubernetes -}}
{{- $allocation := dict
  "batch_size" $a.batchSize
  "batch_delay_ms" $a.batchDelayMs
  "executor_timeout_ms" $a.executorTimeoutMs
  "executor_idle_timeout_ms" $a.executorIdleTimeoutMs
  "delete_on_termination" $a.deleteOnTermination
  "executor_container_name" $a.executorContainerName
  "check_all_containers" $a.checkAllContainers
  "policy" $a.policy
-}}
{{- if not (kindIs "invalid" $a.maxPendingPods) }}{{ $_ := set $allocation "max_pending_pods" $a.maxPendingPods }}{{ end -}}
{{- if not (kindIs "invalid" $a.maxPendingPodsPerProfile) }}{{ $_ := set $allocation "max_pending_pods_per_profile" $a.maxPendingPodsPerProfile }}{{ end -}}
{{- if not (kindIs "invalid" $a.maxExecutors) }}{{ $_ := set $allocation "max_executors" $a.maxExecutors }}{{ end -}}
{{- $config := dict
  "listen" (printf "0.0.0.0:%d" (int .Values.service.port))
  "resync_interval_ms" .Values.resyncIntervalMs
  "driver_end_grace_ms" .Values.driverEndGraceMs
  "allowed_namespaces" .Values.allowedNamespaces
  "kubernetes" (dict
    "qps" $k.qps
    "burst" $k.burst
    "create_concurrency" $k.createConcurrency
    "request_timeout_ms" $k.requestTimeoutMs
    "request_attempts" $k.requestAttempts)
  "allocation" $allocation
  "log" (dict "format" .Values.log.format "filter" .Values.log.filter)
-}}
{{- if .Values.defaultExecutorPodTemplate }}
{{- $_ := set $config "default_executor_pod_template" "/etc/spark-pod-allocator/executor-pod-template.yaml" -}}
{{- end -}}
{{- toYaml (mergeOverwrite $config (deepCopy .Values.extraConfig)) -}}
{{- end -}}

{{- /* Labels of the helm test pod: without app.kubernetes.io/name, so that neither the
Service nor the NetworkPolicy's podSelector picks it up as an allocator pod. */ -}}
{{- define "spa.testSelectorLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end -}}
