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

{{- define "gpu-device-plugin.image" -}}
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

{{/* Where NIC pools write device-information files for CNI plugins: fixed
by the Network Plumbing WG's device-info spec, the same on the host and in
the pod. */}}
{{- define "gpu-device-plugin.deviceInfoDir" -}}
/var/run/k8s.cni.cncf.io/devinfo/dp
{{- end }}
