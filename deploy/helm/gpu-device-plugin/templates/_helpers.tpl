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

{{/* config.yaml: .Values.config with deviceListStrategy, without the keys
that pick settings per node (config.map and the rest), which are the
chart's, not the plugin's. */}}
{{- define "gpu-device-plugin.config" -}}
{{- $cfg := deepCopy (omit (.Values.config | default dict) "map" "default" "nodeLabel") }}
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

{{/* "true" with nodeLabels.mode node (the plugin labels its Node through
the API), else empty; refuses a mode the plugin does not know. */}}
{{- define "gpu-device-plugin.nodeLabelsNode" -}}
{{- if not (has .Values.nodeLabels.mode (list "nfd" "node" "nodefeature" "none")) }}
{{- fail (printf "nodeLabels.mode %q: want nfd (NFD's feature file), node (the Node's labels, through the API), nodefeature (an NFD NodeFeature object, through the API) or none" (toString .Values.nodeLabels.mode)) }}
{{- end }}
{{- if eq .Values.nodeLabels.mode "node" }}true{{ end }}
{{- end }}

{{/* "true" with nodeLabels.mode nodefeature (the plugin keeps an NFD
NodeFeature object in the release namespace through the API), else empty;
refuses a mode the plugin does not know. */}}
{{- define "gpu-device-plugin.nodeLabelsNodeFeature" -}}
{{- $_ := include "gpu-device-plugin.nodeLabelsNode" . }}
{{- if eq .Values.nodeLabels.mode "nodefeature" }}true{{ end }}
{{- end }}

{{/* The node label keys the plugin computes (GPU Feature Discovery's names;
labels.KeyPattern in the Go code, which e2e/deploy checks this against), as
a regular expression for CEL's matches(). */}}
{{- define "gpu-device-plugin.nodeLabelKeys" -}}
^nvidia\.com/((gpu|mig-[0-9a-z][0-9a-z.]*)\.(product|count|replicas|sharing-strategy|memory|multiprocessors|slices\.(gi|ci)|engines\.(copy|decoder|encoder|jpeg|ofa))|gpu\.(family|compute\.(major|minor)|mode|machine|clique)|cuda\.(driver\.(major|minor|rev)|driver-version\.(major|minor|revision|full)|runtime\.(major|minor)|runtime-version\.(major|minor|full))|mig\.(capable|strategy)|mps\.capable|vgpu\.(present|host-driver-version|host-driver-branch))$
{{- end }}

{{/* At most this many keys (labels.MaxKeys in the Go code: what Compute can
return on a node of two GPU models in MIG mode). */}}
{{- define "gpu-device-plugin.nodeLabelMaxKeys" -}}
497
{{- end }}

{{/* At most this long a key: nvidia.com/ and Kubernetes' 63 for the name. */}}
{{- define "gpu-device-plugin.nodeLabelMaxKeyLength" -}}
74
{{- end }}

{{/* GPU Feature Discovery's NodeFeature naming, which the plugin shares
(nodelabels.NodeFeaturePrefix and NodeNameLabel in the Go code): the object
nvidia-features-for-<node>, and NFD's label naming the Node its labels go on. */}}
{{- define "gpu-device-plugin.nodeFeaturePrefix" -}}
nvidia-features-for-
{{- end }}
{{- define "gpu-device-plugin.nodeFeatureNodeLabel" -}}
nfd.node.kubernetes.io/node-name
{{- end }}

{{/* "true" with remediation.cordon (the plugin cordons its own Node while
a GPU needs a reboot), else empty. Refuses config.remediation.cordon: the
chart's RBAC and admission policy follow the chart value, so a config key
would turn it on without the access it needs. */}}
{{- define "gpu-device-plugin.cordon" -}}
{{- $r := get (.Values.config | default dict) "remediation" }}
{{- if and (kindIs "map" $r) (hasKey $r "cordon") }}
{{- fail "config.remediation.cordon: set the chart value remediation.cordon instead; the chart's RBAC and admission policy follow it" }}
{{- end }}
{{- if (.Values.remediation | default dict).cordon }}true{{ end }}
{{- end }}

{{/* The annotation that lists the label keys the plugin keeps on its Node
(nodelabels.Annotation in the Go code). */}}
{{- define "gpu-device-plugin.nodeLabelsAnnotation" -}}
gpu-device-plugin.github.io/node-labels
{{- end }}

{{/* The annotation that marks the plugin's own cordon of its Node
(cordon.Annotation in the Go code, which e2e/deploy checks this against). */}}
{{- define "gpu-device-plugin.cordonAnnotation" -}}
gpu-device-plugin.github.io/cordoned
{{- end }}

{{/* "true" when the pod talks to the API server (DRA mode, events,
nodeCondition, nodeLabels.mode node or nodefeature, remediation.cordon),
else empty: it then gets a ServiceAccount, its token and its node's name. */}}
{{- define "gpu-device-plugin.apiAccess" -}}
{{- if or (include "gpu-device-plugin.dra" .) (include "gpu-device-plugin.report" .) (include "gpu-device-plugin.nodeLabelsNode" .) (include "gpu-device-plugin.nodeLabelsNodeFeature" .) (include "gpu-device-plugin.cordon" .) }}true{{ end }}
{{- end }}

{{/* podResources.hostDir, checked and cleaned: the same path on the host
and in the pod. */}}
{{- define "gpu-device-plugin.podResourcesDir" -}}
{{- if not (isAbs .Values.podResources.hostDir) }}
{{- fail (printf "podResources.hostDir %q: want an absolute host path, such as /var/lib/kubelet/pod-resources" .Values.podResources.hostDir) }}
{{- end }}
{{- clean .Values.podResources.hostDir }}
{{- end }}

{{/* The ServiceAccount of DRA mode, events, nodeCondition, nodeLabels
mode node or nodefeature and remediation.cordon (device-plugin mode without
them uses none). */}}
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

{{/* The DaemonSets to render, one per set of plugin settings, as the list
.out.variants; each has name (its config.map name, "" for config's own
settings), daemonSet, configKey (its key in the ConfigMap), settings,
nodeAffinity (a match expression on config.nodeLabel, or none), selects
(whether its selector and pods carry the config label) and ctx
(the root context with .Values.config set to its settings and .Variant to
itself), for the templates to render it with. Nodes pick settings by
label, as NVIDIA's chart does, but through the DaemonSet controller: the
plugin needs no API access to read its node's labels. Called as
(dict "root" $ "out" $out): a template can only return text. */}}
{{- define "gpu-device-plugin.variants" -}}
{{- $root := .root }}
{{- $config := $root.Values.config | default dict }}
{{- $named := get $config "map" | default dict }}
{{- $default := toString (get $config "default" | default "") }}
{{- $labelKey := toString (get $config "nodeLabel" | default "") }}
{{- $fullname := include "gpu-device-plugin.fullname" $root }}
{{- $settings := dict }}
{{- range $n := keys $named | sortAlpha }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $n) }}
{{- fail (printf "config.map: name %q: want lower-case letters, digits and '-' (a node label value and part of a DaemonSet name, such as h100-nic-pools)" $n) }}
{{- end }}
{{- if gt (len (printf "%s-%s" $fullname $n)) 63 }}
{{- fail (printf "config.map: name %q makes DaemonSet %s-%s, longer than 63 characters; use a shorter name" $n $fullname $n) }}
{{- end }}
{{- $s := get $named $n }}
{{- /* YAML text too, as NVIDIA's chart takes (--set-file config.map.NAME=FILE). */}}
{{- if kindIs "string" $s }}
{{- $s = fromYaml $s }}
{{- if hasKey $s "Error" }}
{{- fail (printf "config.map.%s: not YAML: %s" $n (get $s "Error")) }}
{{- end }}
{{- end }}
{{- if not (kindIs "map" $s) }}
{{- fail (printf "config.map.%s: want the plugin's settings (as in config), as a map or YAML text" $n) }}
{{- end }}
{{- range list "map" "default" "nodeLabel" }}
{{- if hasKey $s . }}
{{- fail (printf "config.map.%s.%s: %s is a key of config itself, not of a named config" $n . .) }}
{{- end }}
{{- end }}
{{- $_ := set $settings $n $s }}
{{- end }}
{{- if and $named (not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $labelKey)) }}
{{- fail (printf "config.nodeLabel %q: want a node label key, such as nvidia.com/device-plugin.config" $labelKey) }}
{{- end }}
{{- /* config.default names the settings of nodes without a label naming
one of config.map's (no label, or another value); empty, config's own. */}}
{{- $base := omit $config "map" "default" "nodeLabel" }}
{{- if $default }}
{{- if not (hasKey $settings $default) }}
{{- fail (printf "config.default %q: not a name in config.map (%s)" $default (keys $settings | sortAlpha | join ", ")) }}
{{- end }}
{{- $base = get $settings $default }}
{{- end }}
{{- $others := without (keys $settings | sortAlpha) $default }}
{{- $variants := list }}
{{- $variants = append $variants (dict "name" $default "daemonSet" $fullname "configKey" "config.yaml" "settings" $base "selects" false
  "nodeAffinity" (ternary (dict "key" $labelKey "operator" "NotIn" "values" $others) dict (gt (len $others) 0))) }}
{{- range $n := $others }}
{{- $variants = append $variants (dict "name" $n "daemonSet" (printf "%s-%s" $fullname $n) "configKey" (printf "config.%s.yaml" $n) "settings" (get $settings $n) "selects" true
  "nodeAffinity" (dict "key" $labelKey "operator" "In" "values" (list $n))) }}
{{- end }}
{{- range $v := $variants }}
{{- $vals := deepCopy $root.Values }}
{{- $_ := set $vals "config" $v.settings }}
{{- $_ := set $v "perNode" (gt (len $settings) 0) }}
{{- $_ := set $v "ctx" (dict "Values" $vals "Release" $root.Release "Chart" $root.Chart "Capabilities" $root.Capabilities "Template" $root.Template "Files" $root.Files "Variant" $v) }}
{{- end }}
{{- $_ := set .out "variants" $variants }}
{{- end }}

{{/* The NIC pools of every DaemonSet's settings, each name once (the
first settings that declare it win), as .out.pools: DRA mode makes one
DeviceClass per pool, whichever nodes have it. */}}
{{- define "gpu-device-plugin.allNICPools" -}}
{{- $v := dict }}
{{- $_ := include "gpu-device-plugin.variants" (dict "root" .root "out" $v) }}
{{- $seen := dict }}
{{- $pools := list }}
{{- range $v.variants }}
{{- range (get .settings "nicResources" | default list) }}
{{- if not (hasKey $seen (toString .name)) }}
{{- $_ := set $seen (toString .name) true }}
{{- $pools = append $pools . }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set .out "pools" $pools }}
{{- end }}

{{/* The label that tells apart the pods of config.map's DaemonSets. The
default DaemonSet's selector stays the chart's usual one, so that adding
config.map to a release changes no existing selector (immutable): it
overlaps theirs, which Kubernetes allows since each DaemonSet only takes
pods it owns. */}}
{{- define "gpu-device-plugin.configLabel" -}}
gpu-device-plugin.github.io/config
{{- end }}

{{/* The field manager the plugin writes as, on every API call (the
kubeapi client's fieldManager, the DRA client's user agent and its claim
status apply): the admission policies tell its own managedFields entry from
the others' by it. */}}
{{- define "gpu-device-plugin.fieldManager" -}}
gpu-device-plugin
{{- end }}

{{/* The variables that find forged managedFields entries, for a policy's
variables list. A client may write metadata.managedFields itself: an entry
made up for another manager, or a field added to one, makes that manager's
next server-side apply remove the field, though the policy refused the
change outright. So every entry but the plugin's own (whose time and fields
the API server writes on each request) must be in the old object as it was,
or have lost fields only: the API server takes from other entries the
fields the plugin changes or removes. Compared three levels deep
(f:metadata, f:labels, the key), and equal below. "ancient-changes" is
where the API server folds the oldest update managers together; nobody
applies as it, so its fields remove nothing. On CREATE no other entry may
exist. Sets forgedManagers, the managers whose entries are new or grew. */}}
{{- define "gpu-device-plugin.managedFieldsVariables" -}}
- name: fieldManager
  expression: >-
    {{ include "gpu-device-plugin.fieldManager" . | quote }}
{{ include "gpu-device-plugin.managedFieldsChecks" . }}
{{- end }}

{{/* managedFieldsVariables without fieldManager, for a policy whose writer
writes as a manager of its own (the ComputeDomain policy: one per node);
such a policy defines fieldManager before these. */}}
{{- define "gpu-device-plugin.managedFieldsChecks" -}}
- name: foreignEntries
  expression: >-
    request.operation == "DELETE" ? [] :
    object.metadata.?managedFields.orValue([]).filter(e, e.?manager.orValue("") != variables.fieldManager &&
    (request.operation == "CREATE" || e.?manager.orValue("") != "ancient-changes"))
- name: oldForeignEntries
  expression: >-
    request.operation != "UPDATE" ? [] :
    oldObject.metadata.?managedFields.orValue([]).filter(e, e.?manager.orValue("") != variables.fieldManager)
- name: forgedManagers
  expression: >-
    variables.foreignEntries.filter(e, !variables.oldForeignEntries.exists(o,
    o.?manager.orValue("") == e.?manager.orValue("") && o.?operation.orValue("") == e.?operation.orValue("") &&
    o.?subresource.orValue("") == e.?subresource.orValue("") && o.?apiVersion.orValue("") == e.?apiVersion.orValue("") &&
    o.?time.orValue("") == e.?time.orValue("") && o.?fieldsType.orValue("") == e.?fieldsType.orValue("") &&
    (o.?fieldsV1.orValue({}) == e.?fieldsV1.orValue({}) ||
    e.?fieldsV1.orValue({}).all(a, a in o.?fieldsV1.orValue({}) && (e.fieldsV1[a] == o.fieldsV1[a] ||
    e.fieldsV1[a].all(b, b in o.fieldsV1[a] && (e.fieldsV1[a][b] == o.fieldsV1[a][b] ||
    e.fieldsV1[a][b].all(c, c in o.fieldsV1[a][b] && e.fieldsV1[a][b][c] == o.fieldsV1[a][b][c])))))))
    ).map(e, e.?manager.orValue("(no name)"))
{{- end }}

{{/* The validation that goes with gpu-device-plugin.managedFieldsVariables. */}}
{{- define "gpu-device-plugin.managedFieldsValidation" -}}
- expression: size(variables.forgedManagers) == 0
  messageExpression: >-
    "the plugin may write only its own managedFields entry (manager " + variables.fieldManager +
    "); it may not add or widen the entries of " + variables.forgedManagers.join(", ")
{{- end }}

{{/* The opt-outs that widen what a stolen plugin token may do, each with
the exact acknowledgement it needs, as a list of dicts (key, ack, phrase,
widened) in .out.optOuts, those in force only (their feature on). */}}
{{- define "gpu-device-plugin.optOuts" -}}
{{- $root := .root }}
{{- $all := list }}
{{- if and $root.Values.nodeCondition.enabled (not $root.Values.nodeCondition.restrictToOwnNode) }}
{{- $all = append $all (dict "key" "nodeCondition.restrictToOwnNode" "ack" "nodeCondition.restrictToOwnNodeAcknowledged" "given" $root.Values.nodeCondition.restrictToOwnNodeAcknowledged
  "phrase" "a stolen token can patch every Node's status"
  "widened" "the plugin's token may patch the status of every Node (conditions, addresses, capacity, labels and annotations), not only its own Node's GPUHealthy and NICHealthy conditions") }}
{{- end }}
{{- if and (include "gpu-device-plugin.dra" $root) (not $root.Values.dra.restrictSlicesToNode) }}
{{- $all = append $all (dict "key" "dra.restrictSlicesToNode" "ack" "dra.restrictSlicesToNodeAcknowledged" "given" $root.Values.dra.restrictSlicesToNodeAcknowledged
  "phrase" "a stolen token can write every node's ResourceSlices and claim status"
  "widened" "the plugin's token may create, change and delete the ResourceSlices of every node and driver, and write any claim's status that the API server itself admits, not only its own node's") }}
{{- end }}
{{- $_ := set .out "optOuts" $all }}
{{- end }}

{{/* Refuses an opt-out in force without its acknowledgement, in one line
naming the key and the fix. */}}
{{- define "gpu-device-plugin.checkOptOuts" -}}
{{- $o := dict }}
{{- $_ := include "gpu-device-plugin.optOuts" (dict "root" . "out" $o) }}
{{- range $o.optOuts }}
{{- if ne (toString .given) .phrase }}
{{- fail (printf "%s: false widens the plugin's token (%s); keep it true, or set %s to %q to accept that" .key .widened .ack .phrase) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The MPS launcher's socket, in mpsRoot (both pods mount it at its host
path); empty when the launcher is off. */}}
{{- define "gpu-device-plugin.mpsLauncherSocket" -}}
{{- if .Values.mpsLauncher.enabled }}{{ clean .Values.mpsRoot }}/launcher.sock{{ end }}
{{- end }}

{{/* The MPS launcher's pod labels: another app.kubernetes.io/name, so that
no selector of the plugin's pods (its DaemonSet's, the metrics Service's,
kubectl's) takes them. */}}
{{- define "gpu-device-plugin.mpsLauncherSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-device-plugin.name" . }}-mps-launcher
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The pods' affinity, the same for every DaemonSet of the chart: affinity,
with gpuNodeSelectorTerms as its required node affinity unless it has one of
its own, and expr (config.map's match expression on the node label, or an
empty dict) ANDed into each required term (terms are ORed, a term's
expressions ANDed). Called as (dict "Values" .Values "expr" $expr); renders
YAML, or nothing. */}}
{{- define "gpu-device-plugin.affinity" -}}
{{- $expr := .expr }}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- $na := get $affinity "nodeAffinity" | default dict }}
{{- $req := get $na "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $terms := get $req "nodeSelectorTerms" | default (get .Values "gpuNodeSelectorTerms") | default list }}
{{- if $expr }}
{{- $anded := list }}
{{- range ($terms | default (list (dict))) }}
{{- $anded = append $anded (set (deepCopy .) "matchExpressions" (append (get . "matchExpressions" | default list) $expr)) }}
{{- end }}
{{- $terms = $anded }}
{{- end }}
{{- if $terms }}
{{- $_ := set $req "nodeSelectorTerms" $terms }}
{{- $_ := set $na "requiredDuringSchedulingIgnoredDuringExecution" $req }}
{{- $_ := set $affinity "nodeAffinity" $na }}
{{- end }}
{{- with $affinity }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* Refuses, in one line, a feature the cluster's Kubernetes
(.Capabilities.KubeVersion: the API server's version on install and
upgrade, helm template's --kube-version) is too old for. Chart.yaml's
kubeVersion is the default install's minimum; these need more. */}}
{{- define "gpu-device-plugin.checkKubeVersion" -}}
{{- $needs := list }}
{{- if include "gpu-device-plugin.dra" . }}
{{- $needs = append $needs (list "1.34" "kubeletAPI dra (resource.k8s.io/v1, Dynamic Resource Allocation)") }}
{{- end }}
{{- if and .Values.nodeCondition.enabled .Values.nodeCondition.restrictToOwnNode }}
{{- $needs = append $needs (list "1.32" "nodeCondition.restrictToOwnNode (an admission policy that reads the node name in the plugin's token)") }}
{{- end }}
{{- if include "gpu-device-plugin.nodeLabelsNode" . }}
{{- $needs = append $needs (list "1.32" "nodeLabels.mode node (an admission policy that reads the node name in the plugin's token)") }}
{{- end }}
{{- if include "gpu-device-plugin.nodeLabelsNodeFeature" . }}
{{- $needs = append $needs (list "1.32" "nodeLabels.mode nodefeature (an admission policy that reads the node name in the plugin's token)") }}
{{- end }}
{{- if include "gpu-device-plugin.cordon" . }}
{{- $needs = append $needs (list "1.32" "remediation.cordon (an admission policy that reads the node name in the plugin's token)") }}
{{- end }}
{{- $unmet := list }}
{{- range $needs }}
{{- if not (semverCompare (printf ">=%s.0-0" (index . 0)) $.Capabilities.KubeVersion.Version) }}
{{- $unmet = append $unmet (printf "%s needs Kubernetes %s or later" (index . 1) (index . 0)) }}
{{- end }}
{{- end }}
{{- if $unmet }}
{{- fail (printf "Kubernetes %s: %s" .Capabilities.KubeVersion.Version (join "; " $unmet)) }}
{{- end }}
{{- end }}

{{/* For NOTES.txt: the nodes the DaemonSets run on, in words, as .out.nodes
("nodes labelled a=true or b=true"), and the labels that put a node among them,
as .out.labels ("b=true": the last required term's and nodeSelector's,
when each of that term's expressions is In with one value; else empty).
Called as (dict "root" $ "out" $out). */}}
{{- define "gpu-device-plugin.nodesText" -}}
{{- $aff := fromYaml (include "gpu-device-plugin.affinity" (dict "Values" .root.Values "expr" dict)) }}
{{- $terms := dig "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" list $aff }}
{{- $words := list }}
{{- $labels := list }}
{{- range $terms }}
{{- $exprs := list }}
{{- $labels = list }}
{{- range (get . "matchExpressions" | default list) }}
{{- $vals := get . "values" | default list }}
{{- if and (eq .operator "In") (eq (len $vals) 1) }}
{{- $exprs = append $exprs (printf "%s=%s" .key (index $vals 0)) }}
{{- $labels = append $labels (printf "%s=%s" .key (index $vals 0)) }}
{{- else }}
{{- $exprs = append $exprs (trimSuffix " " (printf "%s %s %s" .key .operator (ternary (toJson $vals) "" (gt (len $vals) 0)))) }}
{{- $labels = append $labels "" }}
{{- end }}
{{- end }}
{{- range (get . "matchFields" | default list) }}
{{- $exprs = append $exprs (printf "field %s %s %s" .key .operator (toJson (get . "values" | default list))) }}
{{- $labels = append $labels "" }}
{{- end }}
{{- $words = append $words (join " and " $exprs) }}
{{- end }}
{{- $sel := list }}
{{- range $k, $v := .root.Values.nodeSelector }}
{{- $sel = append $sel (printf "%s=%s" $k $v) }}
{{- end }}
{{- if $words }}
{{- $_ := set .out "nodes" (printf "nodes labelled %s%s" (join " or " $words) (ternary (printf ", and %s" (join ", " $sel)) "" (gt (len $sel) 0))) }}
{{- else if $sel }}
{{- $_ := set .out "nodes" (printf "nodes labelled %s" (join ", " $sel)) }}
{{- else }}
{{- $_ := set .out "nodes" "every node" }}
{{- end }}
{{- if and $terms (or (has "" $labels) (not $labels)) }}
{{- $_ := set .out "labels" "" }}
{{- else }}
{{- $_ := set .out "labels" (concat $labels $sel | join " ") }}
{{- end }}
{{- end }}

{{/* The probes' Unix socket, in the pod's own emptyDir (volume probe). */}}
{{- define "gpu-device-plugin.healthSocket" -}}
/run/probe/health.sock
{{- end }}

{{/* The ComputeDomain controller's name: its Deployment, ServiceAccount,
roles and leader Lease (a label value, so at most 63 characters). */}}
{{- define "gpu-device-plugin.cdController" -}}
{{ include "gpu-device-plugin.fullname" . | trunc 37 | trimSuffix "-" }}-compute-domain-controller
{{- end }}

{{/* The controller's pod labels: not the plugin's selector labels, which
the DaemonSets and the metrics Service select by. */}}
{{- define "gpu-device-plugin.cdControllerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-device-plugin.name" . | trunc 37 | trimSuffix "-" }}-compute-domain-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-device-plugin.cdControllerLabels" -}}
{{ include "gpu-device-plugin.cdControllerSelectorLabels" . }}
app.kubernetes.io/component: compute-domain-controller
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}
