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

{{- /* The configuration file the service reads: `config` as given, over what the chart sets
  from its own values (the keys of spa.chartConfigKeys, which `config` may not set). */ -}}
{{- define "spa.config" -}}
{{- $config := dict
  "listen" (printf "0.0.0.0:%d" (int .Values.service.port))
  "allowed_namespaces" .Values.allowedNamespaces
  "registrations" (dict
    "namespace" .Release.Namespace
    "key_secret" (include "spa.registrationKeySecretName" .))
  "ha" (dict "lease_namespace" .Release.Namespace) -}}
{{- if .Values.metrics.enabled }}
{{- $_ := set $config "metrics" (dict "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port))) -}}
{{- end }}
{{- if not (kindIs "invalid" .Values.health.port) }}
{{- $_ := set $config "health" (dict "listen" (printf "0.0.0.0:%d" (int .Values.health.port))) -}}
{{- end }}
{{- if include "spa.peerCa" . }}
{{- $_ := set $config.ha "peer_ca_file" "/etc/spark-pod-allocator-peer-ca/ca.crt" -}}
{{- $_ := set $config.ha "peer_server_name" (index (include "spa.tlsDnsNames" . | fromYamlArray) 2) -}}
{{- end -}}
{{- if .Values.tls.enabled }}
{{- $_ := set $config "tls" (dict
  "cert_file" "/etc/spark-pod-allocator-tls/tls.crt"
  "key_file" "/etc/spark-pod-allocator-tls/tls.key") -}}
{{- end -}}
{{- if .Values.defaultExecutorPodTemplate }}
{{- $_ := set $config "default_executor_pod_template" "/etc/spark-pod-allocator/executor-pod-template.yaml" -}}
{{- end -}}
{{- toYaml (mergeOverwrite $config (deepCopy (.Values.config | default dict))) -}}
{{- end -}}

{{- /* The keys of the configuration the chart sets from its own values, with the value
  that sets each. */ -}}
{{- define "spa.chartConfigKeys" -}}
{{- toYaml (dict
  "listen" "service.port"
  "allowed_namespaces" "allowedNamespaces"
  "registrations.namespace" "the release's namespace"
  "registrations.key_secret" "registrations.keySecretName"
  "ha.lease_namespace" "the release's namespace"
  "ha.peer_ca_file" "tls.enabled"
  "ha.peer_server_name" "tls.enabled"
  "tls.cert_file" "tls.enabled and tls.secretName"
  "tls.key_file" "tls.enabled and tls.secretName"
  "health.listen" "health.port"
  "metrics.listen" "metrics.enabled and metrics.port"
  "default_executor_pod_template" "defaultExecutorPodTemplate") -}}
{{- end -}}

{{- /* Fails on a key of `config` the chart sets itself; included by the ConfigMap. */ -}}
{{- define "spa.configChecks" -}}
{{- $config := .Values.config | default dict -}}
{{- range $key, $value := include "spa.chartConfigKeys" . | fromYaml -}}
{{- $parts := splitList "." $key -}}
{{- $section := $config -}}
{{- if eq (len $parts) 2 -}}
{{- $section = get $config (first $parts) | default dict -}}
{{- end -}}
{{- if and (kindIs "map" $section) (hasKey $section (last $parts)) -}}
{{- fail (printf "config.%s is set by the chart from %s; set that instead" $key $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* A probe: grpc.health.v1 on the health listener (plaintext, outside the gRPC port's
connection cap); without one, on the gRPC port, or a TCP connect there with TLS, as the
kubelet's gRPC probe does not speak TLS. */ -}}
{{- define "spa.probe" -}}
{{- if not (kindIs "invalid" .Values.health.port) -}}
grpc:
  port: {{ .Values.health.port }}
{{- else if .Values.tls.enabled -}}
tcpSocket:
  port: {{ .Values.service.port }}
{{- else -}}
grpc:
  port: {{ .Values.service.port }}
{{- end -}}
{{- end -}}

{{- /* The kubernetes.io/tls Secret the pod mounts: tls.secretName, else <fullname>-tls
(generated by the chart, or written by cert-manager). */ -}}
{{- define "spa.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "spa.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{- /* Whether the chart generates the certificate (no cert-manager, no Secret of yours). */ -}}
{{- /* "true" when the replicas reach each other over TLS (tls.enabled): they verify each
  other with the CA the chart publishes (generated, or tls.caCertificate), else with the
  ca.crt of the certificate's Secret (cert-manager's CA and Vault issuers write it). */ -}}
{{- define "spa.peerCa" -}}
{{- if .Values.tls.enabled -}}true{{- end -}}
{{- end -}}

{{- /* Fails when the service would have no namespace to work in (the schema refuses it
  first; this says the same with --skip-schema-validation). Included by the RBAC. */ -}}
{{- define "spa.namespaceChecks" -}}
{{- if and (not .Values.allowedNamespaces) (not .Values.rbac.clusterWide) -}}
{{- fail "allowedNamespaces is empty: set allowedNamespaces to the namespaces of your Spark drivers (--set allowedNamespaces={spark}), or rbac.clusterWide=true" -}}
{{- end -}}
{{- end -}}

{{- define "spa.replicaChecks" -}}
{{- if and .Values.podDisruptionBudget.enabled (gt (int .Values.replicaCount) 1) (ge (int .Values.podDisruptionBudget.minAvailable) (int .Values.replicaCount)) -}}
{{- fail "podDisruptionBudget.minAvailable must be below replicaCount, or no node could ever be drained" -}}
{{- end -}}
{{- end -}}

{{- define "spa.tlsGenerated" -}}
{{- if and .Values.tls.enabled (not .Values.tls.certManager.enabled) (not .Values.tls.secretName) -}}true{{- end -}}
{{- end -}}

{{- /* The ConfigMap with the CA certificate (ca.crt) for drivers, in the release's
namespace and each of allowedNamespaces. */ -}}
{{- define "spa.caConfigMapName" -}}
{{- printf "%s-ca" (include "spa.fullname" .) -}}
{{- end -}}

{{- /* Whether the chart knows the CA (generated, or tls.caCertificate given). */ -}}
{{- define "spa.caKnown" -}}
{{- if and .Values.tls.enabled (or (include "spa.tlsGenerated" .) .Values.tls.caCertificate) -}}true{{- end -}}
{{- end -}}

{{- /* The DNS names of the gRPC Service, which the certificate covers. */ -}}
{{- define "spa.tlsDnsNames" -}}
{{- $name := include "spa.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.%s" $name $ns .Values.tls.clusterDomain) -}}
{{- toYaml (concat $names .Values.tls.dnsNames | uniq) -}}
{{- end -}}

{{- /* The Secret holding the registrations' signing key. */ -}}
{{- define "spa.registrationKeySecretName" -}}
{{- default (printf "%s-registration-key" (include "spa.fullname" .)) .Values.registrations.keySecretName -}}
{{- end -}}

{{- /* Labels of the helm test pod: without app.kubernetes.io/name, so that neither the
Service nor the NetworkPolicy's podSelector picks it up as an allocator pod. */ -}}
{{- define "spa.testSelectorLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end -}}

{{- /* Labels of the metrics Service, which a ServiceMonitor selects (the gRPC Service lacks the component). */ -}}
{{- define "spa.metricsServiceLabels" -}}
{{ include "spa.selectorLabels" . }}
app.kubernetes.io/component: metrics
{{- end -}}

{{- /* Fails on metrics values that contradict each other; included by every metrics template. */ -}}
{{- define "spa.metricsChecks" -}}
{{- $m := .Values.metrics -}}
{{- if not $m.enabled -}}
{{- range $key := list "podMonitor" "serviceMonitor" "prometheusRule" "dashboard" -}}
{{- if (get $m $key).enabled -}}
{{- fail (printf "metrics.%s.enabled needs metrics.enabled: the service serves no metrics without it" $key) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- if eq (int $m.port) (int $.Values.service.port) -}}
{{- fail "metrics.port must differ from service.port (metrics have a port of their own)" -}}
{{- end -}}
{{- if and $m.podMonitor.enabled $m.serviceMonitor.enabled -}}
{{- fail "metrics.podMonitor.enabled and metrics.serviceMonitor.enabled: enable one, else Prometheus scrapes the pod twice" -}}
{{- end -}}
{{- range $key := list "podMonitor" "serviceMonitor" -}}
{{- $monitor := get $m $key -}}
{{- if and $monitor.enabled (gt (include "spa.durationMs" $monitor.scrapeTimeout | int64) (include "spa.durationMs" $monitor.interval | int64)) -}}
{{- fail (printf "metrics.%s.scrapeTimeout (%s) must not exceed its interval (%s): Prometheus refuses such a scrape" $key $monitor.scrapeTimeout $monitor.interval) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* A Prometheus duration (1h30m, 30s, 500ms; the schema checks its form) in milliseconds. */ -}}
{{- define "spa.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 -}}
{{- $total := 0 -}}
{{- range $part := regexFindAll "[0-9]+(ms|[smhdwy])" . -1 -}}
{{- $count := regexFind "^[0-9]+" $part -}}
{{- $total = add $total (mul (int64 $count) (get $units (trimPrefix $count $part))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{- /* Fails on a health port that another listener has; included by the Deployment. */ -}}
{{- define "spa.healthChecks" -}}
{{- $port := .Values.health.port -}}
{{- if not (kindIs "invalid" $port) -}}
{{- if eq (int $port) (int .Values.service.port) -}}
{{- fail "health.port must differ from service.port (the health listener is apart from the gRPC port, outside its connection cap)" -}}
{{- end -}}
{{- if and .Values.metrics.enabled (eq (int $port) (int .Values.metrics.port)) -}}
{{- fail "health.port must differ from metrics.port" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Fails on an extraEnv entry the chart sets itself: the container would list the name
  twice (the API server warns; server-side apply keeps one of them). Included by the
  Deployment. */ -}}
{{- define "spa.envChecks" -}}
{{- range .Values.extraEnv -}}
{{- if has .name (list "SPARK_POD_ALLOCATOR__LISTEN" "POD_NAME" "POD_IP") -}}
{{- fail (printf "extraEnv: %s is set by the chart (SPARK_POD_ALLOCATOR__LISTEN from service.port, POD_NAME and POD_IP from the pod); set service.port instead, or leave it" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The names of the shards' Leases (spark-pod-allocator-shard-<n>), as a list.
*/}}
{{- define "spa.shardLeaseNames" -}}
{{- $names := list -}}
{{- range $n := until (int (dig "ha" "shards" 1 (.Values.config | default dict))) -}}
{{- $names = append $names (printf "spark-pod-allocator-shard-%d" $n) -}}
{{- end -}}
{{- toJson $names -}}
{{- end }}

{{/*
Which namespaces each queue budget holds: it decides shards, so unlike the rest of the
budgets it is read at start-up only, and the pods' config checksum includes it.
*/}}
{{- define "spa.queueMembership" -}}
{{- $membership := list -}}
{{- range (dig "budgets" (list) (.Values.config | default dict)) }}
{{- if .queue }}
{{- $names := list -}}
{{- range .namespaces }}
{{- if kindIs "string" . }}{{ $names = append $names . }}{{ else }}{{ $names = append $names .namespace }}{{ end -}}
{{- end -}}
{{- $membership = append $membership (dict "queue" .queue "namespaces" $names) -}}
{{- end -}}
{{- end -}}
{{- toYaml $membership -}}
{{- end -}}
