{{/* The release's objects are named after the release, or release-chart when it differs. */}}
{{- define "watchproxy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "watchproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "watchproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "watchproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "watchproxy.labels" -}}
{{ include "watchproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "watchproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "watchproxy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "watchproxy.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Host header tenants send is the Service's name: the API port refuses any other. */}}
{{- define "watchproxy.serviceHosts" -}}
{{- $service := printf "%s.%s.svc" (include "watchproxy.fullname" .) .Release.Namespace -}}
{{- list $service (printf "%s.%s" $service .Values.clusterDomain) | toJson -}}
{{- end -}}

{{/* config with the Service's names in front of listen.allowed_hosts. */}}
{{- define "watchproxy.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $listen := default dict $config.listen -}}
{{- $hosts := concat (include "watchproxy.serviceHosts" . | fromJsonArray) (default list $listen.allowed_hosts) | uniq -}}
{{- $_ := set $listen "allowed_hosts" $hosts -}}
{{- $_ := set $config "listen" $listen -}}
{{- toYaml $config -}}
{{- end -}}
