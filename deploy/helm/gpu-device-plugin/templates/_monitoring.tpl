{{/* The alerts of metrics.prometheusRule.alerts, in the order the rule
lists them. */}}
{{- define "gpu-device-plugin.alertNames" -}}
deviceUnhealthy notReady targetDown targetAbsent mpsDaemonDown apiWritesFailing gpuNeedsHuman nodeNeedsReboot resetFailing
{{- end }}

{{/* The job label of the plugin's series in Prometheus: the metrics
Service's name, which is the job a ServiceMonitor gives them, unless
metrics.prometheusRule.job names another. */}}
{{- define "gpu-device-plugin.metricsJob" -}}
{{- .Values.metrics.prometheusRule.job | default (printf "%s-metrics" (include "gpu-device-plugin.fullname" .)) }}
{{- end }}

{{/* The labels of a monitoring object: the chart's, with component
.component (if given), and .extra, the user's, which cannot replace the
chart's. Called as (dict "root" $ "component" "dashboard" "extra" $labels). */}}
{{- define "gpu-device-plugin.monitoringLabels" -}}
{{- $labels := include "gpu-device-plugin.labels" .root | fromYaml }}
{{- with get . "component" }}
{{- $_ := set $labels "app.kubernetes.io/component" . }}
{{- end }}
{{- toYaml (merge $labels (get . "extra" | default dict)) }}
{{- end }}

{{/* Refuses, in one line naming the value and the fix, a monitoring value
of the wrong type, and a ServiceMonitor, PrometheusRule or dashboard
without what it needs: metrics on, the metrics Service, and the Prometheus
Operator's CRDs (.Capabilities.APIVersions: the API server's on install and
upgrade, helm template's --api-versions). Every template of the three
includes it, so that each one checks what it renders. */}}
{{- define "gpu-device-plugin.checkMonitoring" -}}
{{- $m := .Values.metrics }}
{{- /* Types first: a quoted "false" is true to a template, and a number
where a duration goes reaches Prometheus as a broken config. */}}
{{- $bools := list (list "metrics.enabled" $m.enabled) (list "metrics.service.enabled" $m.service.enabled) }}
{{- $durations := list }}
{{- $strings := list }}
{{- $maps := list }}
{{- $lists := list }}
{{- range $k := list "serviceMonitor" "prometheusRule" "dashboard" }}
{{- $v := get $m $k }}
{{- if not (kindIs "map" $v) }}
{{- fail (printf "metrics.%s: want a map of settings (values.yaml lists them), not %s" $k (toJson $v)) }}
{{- end }}
{{- $bools = append $bools (list (printf "metrics.%s.enabled" $k) $v.enabled) }}
{{- $strings = append $strings (list (printf "metrics.%s.namespace" $k) $v.namespace) }}
{{- $maps = append $maps (list (printf "metrics.%s.labels" $k) $v.labels) }}
{{- end }}
{{- $sm := $m.serviceMonitor }}
{{- $durations = concat $durations (list (list "metrics.serviceMonitor.interval" $sm.interval "") (list "metrics.serviceMonitor.scrapeTimeout" $sm.scrapeTimeout "")) }}
{{- $lists = concat $lists (list (list "metrics.serviceMonitor.relabelings" $sm.relabelings) (list "metrics.serviceMonitor.metricRelabelings" $sm.metricRelabelings)) }}
{{- $pr := $m.prometheusRule }}
{{- $strings = concat $strings (list (list "metrics.prometheusRule.job" $pr.job) (list "metrics.prometheusRule.runbookURL" $pr.runbookURL)) }}
{{- $maps = append $maps (list "metrics.prometheusRule.alertLabels" $pr.alertLabels) }}
{{- $maps = append $maps (list "metrics.dashboard.annotations" $m.dashboard.annotations) }}
{{- $known := splitList " " (include "gpu-device-plugin.alertNames" .) }}
{{- if not (kindIs "map" $pr.alerts) }}
{{- fail (printf "metrics.prometheusRule.alerts: want a map of alerts (%s), not %s" (join ", " $known) (toJson $pr.alerts)) }}
{{- end }}
{{- range $name := keys $pr.alerts | sortAlpha }}
{{- if not (has $name $known) }}
{{- fail (printf "metrics.prometheusRule.alerts.%s: no such alert; the alerts are %s" $name (join ", " $known)) }}
{{- end }}
{{- end }}
{{- range $name := $known }}
{{- $a := get $pr.alerts $name }}
{{- $p := printf "metrics.prometheusRule.alerts.%s" $name }}
{{- if not (kindIs "map" $a) }}
{{- fail (printf "%s: want a map with enabled, for and severity, not %s" $p (toJson $a)) }}
{{- end }}
{{- $bools = append $bools (list (printf "%s.enabled" $p) $a.enabled) }}
{{- $durations = append $durations (list (printf "%s.for" $p) (get $a "for") "5m") }}
{{- $strings = append $strings (list (printf "%s.severity" $p) $a.severity) }}
{{- if not $a.severity }}
{{- fail (printf "%s.severity: want a severity label, such as warning or critical" $p) }}
{{- end }}
{{- end }}
{{- /* The alerts that count failures: more than threshold within window. */}}
{{- range $c := list (list "apiWritesFailing" "15m" "failed writes") (list "resetFailing" "1h" "failed resets") }}
{{- $name := index $c 0 }}
{{- $a := get $pr.alerts $name }}
{{- $p := printf "metrics.prometheusRule.alerts.%s" $name }}
{{- $durations = append $durations (list (printf "%s.window" $p) $a.window (index $c 1)) }}
{{- if not (or (kindIs "float64" $a.threshold) (kindIs "int64" $a.threshold) (kindIs "int" $a.threshold)) }}
{{- fail (printf "%s.threshold %s: want a number, 0 or more (%s within window)" $p (toJson $a.threshold) (index $c 2)) }}
{{- end }}
{{- if lt (float64 $a.threshold) 0.0 }}
{{- fail (printf "%s.threshold %v: want 0 or more (%s within window)" $p $a.threshold (index $c 2)) }}
{{- end }}
{{- end }}
{{- range $bools }}
{{- if not (kindIs "bool" (index . 1)) }}
{{- fail (printf "%s %s: want true or false (a YAML boolean, not a string)" (index . 0) (toJson (index . 1))) }}
{{- end }}
{{- end }}
{{- range $strings }}
{{- if not (kindIs "string" (index . 1)) }}
{{- fail (printf "%s %s: want a string" (index . 0) (toJson (index . 1))) }}
{{- end }}
{{- end }}
{{- range $durations }}
{{- $d := index . 1 }}
{{- $example := index . 2 }}
{{- /* Prometheus' duration (model.ParseDuration), which the Prometheus
Operator's CRDs take; empty only where there is no example (optional). */}}
{{- if or (not (kindIs "string" $d)) (and $example (not $d)) (not (regexMatch "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$" (toString $d))) }}
{{- fail (printf "%s %s: want a Prometheus duration such as %s (units ms, s, m, h, d, w, y)%s" (index . 0) (toJson $d) ($example | default "30s") (ternary "" ", or empty" (not (empty $example)))) }}
{{- end }}
{{- end }}
{{- range $maps }}
{{- $v := index . 1 }}
{{- if not (kindIs "map" $v) }}
{{- fail (printf "%s %s: want a map of names to strings, such as {team: gpu}" (index . 0) (toJson $v)) }}
{{- end }}
{{- $path := index . 0 }}
{{- range $k, $x := $v }}
{{- if not (kindIs "string" $x) }}
{{- fail (printf "%s.%s %s: want a string; quote it (%q)" $path $k (toJson $x) (toString $x)) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $lists }}
{{- if not (kindIs "slice" (index . 1)) }}
{{- fail (printf "%s %s: want a list (the Prometheus Operator's RelabelConfig fields), such as [{action: drop, sourceLabels: [__name__], regex: go_.*}]" (index . 0) (toJson (index . 1))) }}
{{- end }}
{{- end }}
{{- /* Then what each one needs, all in one line. */}}
{{- $unmet := list }}
{{- if $sm.enabled }}
{{- $off := list }}
{{- if not $m.enabled }}{{ $off = append $off "metrics.enabled=true" }}{{ end }}
{{- if not $m.service.enabled }}{{ $off = append $off "metrics.service.enabled=true" }}{{ end }}
{{- if $off }}
{{- $unmet = append $unmet (printf "metrics.serviceMonitor.enabled scrapes the metrics Service: set %s too, or metrics.serviceMonitor.enabled=false" (join " and " $off)) }}
{{- end }}
{{- $ip := toString ($m.bindAddress | default "") }}
{{- if regexMatch "^(127\\.|::1$|::ffff:127\\.)" $ip }}
{{- $unmet = append $unmet (printf "metrics.serviceMonitor.enabled: Prometheus cannot reach metrics.bindAddress %s, a loopback address; leave metrics.bindAddress empty, or set metrics.serviceMonitor.enabled=false" $ip) }}
{{- end }}
{{- if not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") }}
{{- $unmet = append $unmet "metrics.serviceMonitor.enabled: the cluster lacks the CRD servicemonitors.monitoring.coreos.com (monitoring.coreos.com/v1 ServiceMonitor); install the Prometheus Operator's CRDs, or set metrics.serviceMonitor.enabled=false (helm template: add --api-versions monitoring.coreos.com/v1/ServiceMonitor)" }}
{{- end }}
{{- end }}
{{- if $pr.enabled }}
{{- if not $m.enabled }}
{{- $unmet = append $unmet "metrics.prometheusRule.enabled alerts on the plugin's metrics: set metrics.enabled=true too, or metrics.prometheusRule.enabled=false" }}
{{- end }}
{{- $on := list }}
{{- range $name := $known }}{{ if (get $pr.alerts $name).enabled }}{{ $on = append $on $name }}{{ end }}{{ end }}
{{- if not $on }}
{{- $unmet = append $unmet "metrics.prometheusRule.enabled with every alert off (metrics.prometheusRule.alerts.*.enabled) has no rule to render: turn an alert on, or set metrics.prometheusRule.enabled=false" }}
{{- end }}
{{- if not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") }}
{{- $unmet = append $unmet "metrics.prometheusRule.enabled: the cluster lacks the CRD prometheusrules.monitoring.coreos.com (monitoring.coreos.com/v1 PrometheusRule); install the Prometheus Operator's CRDs, or set metrics.prometheusRule.enabled=false (helm template: add --api-versions monitoring.coreos.com/v1/PrometheusRule)" }}
{{- end }}
{{- end }}
{{- if and $m.dashboard.enabled (not $m.enabled) }}
{{- $unmet = append $unmet "metrics.dashboard.enabled shows the plugin's metrics: set metrics.enabled=true too, or metrics.dashboard.enabled=false" }}
{{- end }}
{{- if $unmet }}
{{- fail (join "; " $unmet) }}
{{- end }}
{{- end }}
