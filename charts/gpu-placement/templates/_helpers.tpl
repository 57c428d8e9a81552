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

{{- /* A doc of the project (docs/<doc>) as a link: in the source tree the chart was released from
(`make release` writes it in the annotation gpu-placement.io/source: <repository>/blob/<commit>), else
the path in a clone. */}}
{{- define "gpu-placement.sourceDoc" -}}
{{- $source := "" -}}
{{- with .chart.Annotations }}{{ $source = index . "gpu-placement.io/source" }}{{ end -}}
{{- if $source }}{{ printf "%s/docs/%s" $source .doc }}{{ else }}{{ printf "docs/%s" .doc }}{{ end -}}
{{- end }}

{{/* The Kubernetes release the chart was tested with (tests/e2e/build_control_plane.sh K8S_VERSION). */}}
{{- define "gpu-placement.testedKubeVersion" -}}v1.37.2{{- end }}

{{/* kube-scheduler's image tag, which must not be newer than the API server (version skew policy):
1. scheduler.image.tag when set: a GitOps install pins it once, to the control plane's full version.
2. With a cluster to ask (helm install/upgrade, Flux), its own version: the patch included, without a
   provider suffix (v1.31.4-eks-1552ad0 -> v1.31.4).
3. Without one (helm template, --dry-run=client, Argo CD), Helm's version is --kube-version or its own
   built-in one, and Argo CD passes only major.minor (argoproj/argo-cd#26330), which Helm reads as X.Y.0:
   a patch above 0 was given and is used; X.Y.0 on the minor the chart was tested with becomes the tested
   patch (v1.37.2); any other X.Y.0 may be a guess, so rendering stops and says what to set, rather than
   deploy a .0 that never follows the control plane's patch releases. */}}
{{- define "gpu-placement.schedulerImageTag" -}}
{{- $kube := semver .Capabilities.KubeVersion.Version }}
{{- $tested := semver (include "gpu-placement.testedKubeVersion" .) }}
{{- if .Values.scheduler.image.tag }}{{ .Values.scheduler.image.tag }}
{{- else if (lookup "v1" "Namespace" "" "kube-system") }}{{ printf "v%d.%d.%d" $kube.Major $kube.Minor $kube.Patch }}
{{- else if gt $kube.Patch 0 }}{{ printf "v%d.%d.%d" $kube.Major $kube.Minor $kube.Patch }}
{{- else if and (eq $kube.Major $tested.Major) (eq $kube.Minor $tested.Minor) }}{{ include "gpu-placement.testedKubeVersion" . }}
{{- else }}
{{- fail (printf "scheduler.image.tag: rendered without a cluster to ask (helm template, --dry-run=client, Argo CD), Helm has Kubernetes v%d.%d.0, its built-in version when no --kube-version is given or what it makes of one without a patch (Argo CD passes only %d.%d), so the patch is unknown: set scheduler.image.tag once to your control plane's full version (kubectl version, Server Version), e.g. --set scheduler.image.tag=v%d.%d.4, or pass --kube-version with the patch, e.g. --kube-version v%d.%d.4 (kube-scheduler must not be newer than the API server; this chart was tested with %s)" $kube.Major $kube.Minor $kube.Major $kube.Minor $kube.Major $kube.Minor $kube.Major $kube.Minor (include "gpu-placement.testedKubeVersion" .)) }}
{{- end }}
{{- end }}

{{/* The service configuration (docs/configuration.md): .Values.config plus the shared top-level keys. */}}
{{- define "gpu-placement.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "schedulerName" .Values.schedulerName }}
{{- $_ = set $config "gpuResources" .Values.gpuResources }}
{{- $_ = set $config "sharedResource" .Values.sharedResource }}
{{- $_ = set $config "exemptNamespaces" (include "gpu-placement.exemptNamespaces" . | fromJsonArray) }}
{{- $_ = set $config "namespaceSelection" .Values.namespaceSelection }}
{{- /* /filter tells kube-scheduler's sample from every feasible node by it (extender/sample.py) */}}
{{- $_ = set $config "percentageOfNodesToScore" (int (.Values.scheduler.percentageOfNodesToScore | default 0)) }}
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

{{/* A GPU resource: the device plugin's, or the implicit extended resource of a configured DRA device class
(deviceclass.resource.kubernetes.io/<class>: kube-scheduler allocates a device of the class for it). */}}
{{- define "gpu-placement.cel.isGpuResource" -}}
{{- $implicit := list }}
{{- range ((.Values.config.dra | default dict).deviceClasses | default (list "gpu.nvidia.com" "mig.nvidia.com")) }}
{{- $implicit = append $implicit (printf "deviceclass.resource.kubernetes.io/%s" .) }}
{{- end -}}
r in {{ include "gpu-placement.cel.list" (concat .Values.gpuResources (list .Values.sharedResource) $implicit | uniq) }} || r.startsWith('nvidia.com/mig-')
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
{{- define "gpu-placement.outcomesLease" -}}
{{- printf "%s-outcomes" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpu-placement.quotaMirrorLease" -}}
{{- printf "%s-quota-mirror" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpu-placement.driversLease" -}}
{{- printf "%s-drivers" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpu-placement.fencesLease" -}}
{{- printf "%s-launch-fences" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpu-placement.refusedLease" -}}
{{- printf "%s-refused" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "gpu-placement.eventsLease" -}}
{{- printf "%s-events" (include "gpu-placement.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
