{{/* Monitoring objects (dashboard ConfigMap, PrometheusRule): on when asked, else with the ServiceMonitor. */}}
{{- define "gpu-placement.monitoringEnabled" -}}
{{- if kindIs "bool" .enabled }}{{ .enabled }}{{ else }}{{ .serviceMonitor }}{{ end -}}
{{- end }}

{{/* A Go or Prometheus duration ("5s", "1m30s", "500ms", "1d") in seconds, for PromQL comparisons. */}}
{{- define "gpu-placement.seconds" -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h|d)" . -1 -}}
{{- $total = addf $total (mulf (regexFind "^[0-9.]+" . | float64) (get $units (regexReplaceAll "^[0-9.]+" . ""))) -}}
{{- end -}}
{{- $total -}}
{{- end }}
