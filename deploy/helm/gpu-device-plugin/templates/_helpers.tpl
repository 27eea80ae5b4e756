{{- define "gpu-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release name when it already contains the chart's name. */}}
{{- define "gpu-device-plugin.fullname" -}}
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

{{- define "gpu-device-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-device-plugin.labels" -}}
{{ include "gpu-device-plugin.selectorLabels" . }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The image. No gpu-device-plugin image is published yet, so the
repository values.yaml names (kept there so that the right one is obvious
once it exists) would only fail to pull on every node: refuse it, and an
empty one, until the user names the image they built and pushed. */}}
{{- define "gpu-device-plugin.image" -}}
{{- if or (not .Values.image.repository) (eq .Values.image.repository "ghcr.io/gpu-device-plugin/gpu-device-plugin") }}
{{- fail (printf "image.repository %q: no gpu-device-plugin image is published yet; build and push your own (make image; make push IMAGE=REGISTRY/gpu-device-plugin:TAG; docs/install.md, Building and pushing the image) and set image.repository and image.tag to it" (toString .Values.image.repository)) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default (printf "v%s" .Chart.AppVersion)) }}
{{- end }}

{{/* config.yaml: .Values.config with deviceListStrategy. */}}
{{- define "gpu-device-plugin.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $_ := set $cfg "deviceListStrategy" .Values.deviceListStrategy }}
{{- toYaml $cfg }}
{{- end }}

{{/* cdiHook.hostDir, checked and cleaned: the same path on the host and in the pod. */}}
{{- define "gpu-device-plugin.cdiHookDir" -}}
{{- if not (isAbs .Values.cdiHook.hostDir) }}
{{- fail (printf "cdiHook.hostDir %q: want an absolute host path, such as /var/lib/gpu-device-plugin/bin" .Values.cdiHook.hostDir) }}
{{- end }}
{{- clean .Values.cdiHook.hostDir }}
{{- end }}

{{/* "true" when config.nicResources declares NIC pools, else empty. */}}
{{- define "gpu-device-plugin.nicPools" -}}
{{- if get (.Values.config | default dict) "nicResources" }}true{{ end }}
{{- end }}

{{/* "true" when the pod uses the host's network (hostNetwork, or NIC pools,
which need it), else empty. */}}
{{- define "gpu-device-plugin.hostNetwork" -}}
{{- if or .Values.hostNetwork (include "gpu-device-plugin.nicPools" .) }}true{{ end }}
{{- end }}

{{/* --metrics-address from metrics.bindAddress and metrics.port. Unset, in
the host's network it is the node's IP (HOST_IP, from the downward API's
status.hostIP; bracketed, which Go takes for IPv4 and IPv6 alike), not every
interface of the host: /metrics has no authentication. */}}
{{- define "gpu-device-plugin.metricsAddress" -}}
{{- $ip := toString (.Values.metrics.bindAddress | default "") }}
{{- if $ip }}
{{- /* An IP: digits, hex and dots, or an IPv6 form (two colons at least),
so a host:port is told apart. */}}
{{- if not (regexMatch "^([0-9.]+|[0-9a-fA-F.]*:[0-9a-fA-F.]*:[0-9a-fA-F:.]*)$" $ip) }}
{{- fail (printf "metrics.bindAddress %q: want an IP address without brackets or port (metrics.port sets it), such as 127.0.0.1, fd00::5 or 0.0.0.0" $ip) }}
{{- end }}
{{- if contains ":" $ip }}[{{ $ip }}]{{ else }}{{ $ip }}{{ end }}:{{ .Values.metrics.port }}
{{- else if include "gpu-device-plugin.hostNetwork" . }}[$(HOST_IP)]:{{ .Values.metrics.port }}
{{- else }}:{{ .Values.metrics.port }}
{{- end }}
{{- end }}

{{/* Where NIC pools write device-information files for CNI plugins: fixed
by the Network Plumbing WG's device-info spec, the same on the host and in
the pod. */}}
{{- define "gpu-device-plugin.deviceInfoDir" -}}
/var/run/k8s.cni.cncf.io/devinfo/dp
{{- end }}

{{/* "true" in DRA mode (kubeletAPI: dra), else empty. Checks kubeletAPI:
RBAC, DeviceClasses and the pod's mounts all follow it, so it is a chart
value, not a config key. */}}
{{- define "gpu-device-plugin.dra" -}}
{{- if hasKey (.Values.config | default dict) "kubeletAPI" }}
{{- fail "config.kubeletAPI: set the chart value kubeletAPI instead (device-plugin or dra); the chart's RBAC, DeviceClasses and mounts follow it" }}
{{- end }}
{{- if eq .Values.kubeletAPI "dra" }}true
{{- else if ne .Values.kubeletAPI "device-plugin" }}
{{- fail (printf "kubeletAPI %q: want device-plugin or dra" .Values.kubeletAPI) }}
{{- end }}
{{- end }}

{{/* The DRA driver name: ResourceSlices' driver, attribute domain,
DeviceClass suffix. Fixed by the plugin (config.DRADriverName). */}}
{{- define "gpu-device-plugin.draDriver" -}}
gpu-device-plugin.github.io
{{- end }}

{{/* "true" when events or nodeCondition is on, else empty. Refuses them
in config: the chart's RBAC, ServiceAccount and node name follow the chart
values, so a config key would turn reporting on without the access it needs. */}}
{{- define "gpu-device-plugin.report" -}}
{{- range list "events" "nodeCondition" }}
{{- if hasKey ($.Values.config | default dict) . }}
{{- fail (printf "config.%s: set the chart value %s.enabled instead; the chart's ServiceAccount and RBAC follow it" . .) }}
{{- end }}
{{- end }}
{{- if or .Values.events.enabled .Values.nodeCondition.enabled }}true{{ end }}
{{- end }}

{{/* "true" when the pod talks to the API server (DRA mode, events,
nodeCondition), else empty: it then gets a ServiceAccount, its token and
its node's name. */}}
{{- define "gpu-device-plugin.apiAccess" -}}
{{- if or (include "gpu-device-plugin.dra" .) (include "gpu-device-plugin.report" .) }}true{{ end }}
{{- end }}

{{/* podResources.hostDir, checked and cleaned: the same path on the host
and in the pod. */}}
{{- define "gpu-device-plugin.podResourcesDir" -}}
{{- if not (isAbs .Values.podResources.hostDir) }}
{{- fail (printf "podResources.hostDir %q: want an absolute host path, such as /var/lib/kubelet/pod-resources" .Values.podResources.hostDir) }}
{{- end }}
{{- clean .Values.podResources.hostDir }}
{{- end }}

{{/* The ServiceAccount of DRA mode, events and nodeCondition (device-plugin
mode without them uses none). */}}
{{- define "gpu-device-plugin.serviceAccountName" -}}
{{- include "gpu-device-plugin.fullname" . }}
{{- end }}

{{/* A DRA host directory, checked and cleaned: the kubelet is told the
socket paths the plugin sees, so it is mounted at the same path. */}}
{{- define "gpu-device-plugin.draDir" -}}
{{- $v := index . 0 }}
{{- $name := index . 1 }}
{{- if not (isAbs $v) }}
{{- fail (printf "dra.%s %q: want an absolute host path" $name $v) }}
{{- end }}
{{- clean $v }}
{{- end }}

{{/* The DeviceClass of a NIC pool: its name lower-cased, "/" and "_" turned
into "-", then ".gpu-device-plugin.github.io": example.com/rdma_a becomes
example.com-rdma-a.gpu-device-plugin.github.io. A pool name always has a
"/", so no pool's class is the GPU class. */}}
{{- define "gpu-device-plugin.nicDeviceClassName" -}}
{{- $n := printf "%s.%s" (. | lower | replace "/" "-" | replace "_" "-") (include "gpu-device-plugin.draDriver" .) }}
{{- if or (gt (len $n) 253) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $n)) }}
{{- fail (printf "config.nicResources: pool %q gives DeviceClass name %q, which is not a DNS subdomain; rename the pool (example: example.com/rdma_numa0)" . $n) }}
{{- end }}
{{- $n }}
{{- end }}
