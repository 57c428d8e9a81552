{{/* Names. Cluster-scoped objects (ClusterRoles, webhook configurations) use the fullname, so two
releases with different names do not collide. 50 characters leave room for the longest suffix. */}}
{{- define "gpu-placement.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-placement.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-placement.schedulerName" -}}{{ include "gpu-placement.fullname" . }}-scheduler{{- end }}
{{- define "gpu-placement.webhookName" -}}{{ include "gpu-placement.fullname" . }}-webhook{{- end }}
{{- define "gpu-placement.configName" -}}{{ include "gpu-placement.fullname" . }}-config{{- end }}
{{/* Both webhook configurations share this name: the service patches them by it. */}}
{{- define "gpu-placement.webhookConfigurationName" -}}{{ include "gpu-placement.fullname" . }}{{- end }}
{{- define "gpu-placement.webhooksName" -}}{{ include "gpu-placement.fullname" . }}-webhooks{{- end }}
{{/* The two certificate sources use different Secrets: cert-manager's is type kubernetes.io/tls and
has no ca.key, so the service could neither reuse nor overwrite it when certManager.enabled is switched. */}}
{{- define "gpu-placement.certSecretName" -}}
{{- include "gpu-placement.fullname" . }}-webhook-{{ if .Values.certManager.enabled }}cert-manager-{{ end }}tls
{{- end }}
{{- define "gpu-placement.certificateName" -}}{{ include "gpu-placement.fullname" . }}-webhook{{- end }}

{{- define "gpu-placement.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpu-placement.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-placement
{{- end }}

{{/* Pod template labels of one component: podLabels, then the selector labels (which always win). */}}
{{- define "gpu-placement.podLabels" -}}
{{- $selector := include "gpu-placement.selectorLabels" . | fromYaml }}
{{- toYaml (merge $selector (deepCopy .ctx.Values.podLabels)) }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "scheduler"). */}}
{{- define "gpu-placement.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-placement.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpu-placement.componentLabels" -}}
{{ include "gpu-placement.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpu-placement.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Exempt namespaces: the configured ones plus the release namespace (the webhook's own pods must
never wait for the webhook). Used by both the ConfigMap and the namespaceSelectors. */}}
{{- define "gpu-placement.exemptNamespaces" -}}
{{- append .Values.exemptNamespaces .Release.Namespace | uniq | toJson }}
{{- end }}

{{/* Every GPU resource kube-scheduler must send to the extender (managedResources). */}}
{{- define "gpu-placement.managedResources" -}}
{{- concat .Values.gpuResources (list .Values.sharedResource) .Values.migResources .Values.extraMigResources | uniq | toJson }}
{{- end }}

{{/* kube-scheduler's image tag: the value, else the cluster's own version (never newer than the API
server, as the skew policy requires), without a provider suffix: v1.31.4-eks-1552ad0 -> v1.31.4.
Rendered without a cluster (helm template, --dry-run=client) and without --kube-version, Helm only
knows its own built-in version (its client's, vX.Y.0): then the tag must be set, since a
kube-scheduler newer than the API server is unsupported. */}}
{{- define "gpu-placement.schedulerImageTag" -}}
{{- $kube := .Capabilities.KubeVersion.Version }}
{{- if .Values.scheduler.image.tag }}{{ .Values.scheduler.image.tag }}
{{- else if and (not (lookup "v1" "Namespace" "" "kube-system")) (eq $kube (printf "%s.0" .Capabilities.HelmVersion.KubeClientVersion)) }}
{{- fail (printf "scheduler.image.tag: rendering without a cluster (helm template, --dry-run=client), Helm knows only its own built-in Kubernetes version (%s), not your control plane's: set scheduler.image.tag to it, e.g. --set scheduler.image.tag=v1.31.4, or pass --kube-version (kube-scheduler must not be newer than the API server)" $kube) }}
{{- else }}{{- $v := semver $kube }}{{ printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch }}
{{- end }}
{{- end }}

{{/* The service configuration (CONTRACT.md section 8): .Values.config plus the shared top-level keys. */}}
{{- define "gpu-placement.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "schedulerName" .Values.schedulerName }}
{{- $_ = set $config "gpuResources" .Values.gpuResources }}
{{- $_ = set $config "sharedResource" .Values.sharedResource }}
{{- $_ = set $config "exemptNamespaces" (include "gpu-placement.exemptNamespaces" . | fromJsonArray) }}
{{- $_ = set $config "namespaceSelection" .Values.namespaceSelection }}
{{- toYaml $config }}
{{- end }}

{{/* Security contexts from the values (the restricted Pod Security profile by default). On OpenShift
the restricted SCC assigns UIDs and GIDs from the namespace's range and refuses others, so there
(openshift.adaptSecurityContext: force, or auto with the security.openshift.io API served) the
fixed IDs are left out. */}}
{{- define "gpu-placement.adaptSecurityContext" -}}
{{- $mode := .Values.openshift.adaptSecurityContext }}
{{- if or (eq $mode "force") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) }}true{{ end }}
{{- end }}

{{- define "gpu-placement.securityContext" -}}
{{- $context := deepCopy .context }}
{{- if include "gpu-placement.adaptSecurityContext" .ctx }}
{{- $context = omit $context "runAsUser" "runAsGroup" "fsGroup" }}
{{- end }}
{{- toYaml $context }}
{{- end }}

{{- define "gpu-placement.containerSecurityContext" -}}
{{- include "gpu-placement.securityContext" (dict "ctx" . "context" .Values.securityContext) }}
{{- end }}

{{- define "gpu-placement.podSecurityContext" -}}
{{- include "gpu-placement.securityContext" (dict "ctx" . "context" .Values.podSecurityContext) }}
{{- end }}

{{/* The namespaces the webhooks act in: not exempt, and opted in (namespaceSelection optIn: labelled
gpu-placement.io/enabled=true) or not opted out (optOut: not labelled "false"). */}}
{{- define "gpu-placement.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: {{ include "gpu-placement.exemptNamespaces" . }}
  - key: gpu-placement.io/enabled
    {{- if eq .Values.namespaceSelection "optIn" }}
    operator: In
    values: ["true"]
    {{- else }}
    operator: NotIn
    values: ["false"]
    {{- end }}
{{- end }}

{{/* CEL for matchConditions, written out over several lines. `object` is the Pod being created;
optional fields are guarded with has(), since reading an absent field is an error (and an error
means failurePolicy). */}}
{{- define "gpu-placement.cel.list" -}}
{{- $quoted := list }}
{{- range . }}{{ $quoted = append $quoted (printf "'%s'" .) }}{{ end -}}
[{{ join ", " $quoted }}]
{{- end }}

{{- define "gpu-placement.cel.isGpuResource" -}}
r in {{ include "gpu-placement.cel.list" (concat .Values.gpuResources (list .Values.sharedResource) | uniq) }} || r.startsWith('nvidia.com/mig-')
{{- end }}

{{- define "gpu-placement.cel.containerAsksGpu" -}}
has(c.resources) && (
  (has(c.resources.requests) && c.resources.requests.exists(r, {{ include "gpu-placement.cel.isGpuResource" . }})) ||
  (has(c.resources.limits) && c.resources.limits.exists(r, {{ include "gpu-placement.cel.isGpuResource" . }})))
{{- end }}

{{/* Any container or init container requests or limits a GPU resource. */}}
{{- define "gpu-placement.cel.asksGpu" -}}
object.spec.containers.exists(c,{{ include "gpu-placement.cel.containerAsksGpu" . | nindent 2 }}) ||
(has(object.spec.initContainers) && object.spec.initContainers.exists(c,{{ include "gpu-placement.cel.containerAsksGpu" . | nindent 2 }}))
{{- end }}

{{/* Tolerates the GPU taint: a key from config.gpuTolerations (nvidia.com/gpu by default), or a bare
`operator: Exists`, which tolerates every taint. */}}
{{- define "gpu-placement.cel.toleratesGpuTaint" -}}
{{- $keys := list "nvidia.com/gpu" }}
{{- range .Values.config.gpuTolerations }}{{ if .key }}{{ $keys = append $keys .key }}{{ end }}{{ end -}}
has(object.spec.tolerations) && object.spec.tolerations.exists(t,
  (has(t.key) && t.key in {{ include "gpu-placement.cel.list" ($keys | uniq) }}) ||
  ((!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists'))
{{- end }}

{{- define "gpu-placement.cel.isDaemonSetPod" -}}
has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, o.kind == 'DaemonSet')
{{- end }}

{{/* The webhook mirrors namespace quotas into ResourceQuotas (in audit mode: deletes the ones it kept). */}}
{{- define "gpu-placement.quotaMirror" -}}
{{- if .Values.webhook.quotaMirror }}true{{ end }}
{{- end }}
{{- define "gpu-placement.draLease" -}}
{{- printf "%s-dra" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpu-placement.quotaMirrorLease" -}}
{{- printf "%s-quota-mirror" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
