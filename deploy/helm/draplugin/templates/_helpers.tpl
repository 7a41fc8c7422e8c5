{{/* Chart name, overridable. */}}
{{- define "draplugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped base name for every namespaced object. */}}
{{- define "draplugin.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "draplugin.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "draplugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels; "component" is kubelet-plugin or controller. */}}
{{- define "draplugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "draplugin.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "draplugin.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "draplugin.kubeletPlugin.serviceAccountName" -}}
{{- if .Values.kubeletPlugin.serviceAccount.create -}}
{{- default (printf "%s-kubelet-plugin" (include "draplugin.fullname" .)) .Values.kubeletPlugin.serviceAccount.name -}}
{{- else -}}
{{- required "kubeletPlugin.serviceAccount.name is required when kubeletPlugin.serviceAccount.create is false" .Values.kubeletPlugin.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "draplugin.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (printf "%s-controller" (include "draplugin.fullname" .)) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Cluster-scoped objects (ClusterRoles, the admission policy) carry the release
namespace in their name so two releases in different namespaces never collide.
*/}}
{{- define "draplugin.clusterName" -}}
{{- printf "%s-%s" (include "draplugin.fullname" .root) .suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The DRA socket directory the kubelet watches for this driver. */}}
{{- define "draplugin.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletRootDir) .Values.driverName -}}
{{- end -}}

{{- define "draplugin.registrationDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletPlugin.kubeletRootDir) -}}
{{- end -}}

{{/*
"on" or "off": whether the plugin writes status.devices and gets the RBAC for it.
kubeletPlugin.deviceStatus "auto" is on only where the server narrows the grant
(Kubernetes 1.36+, granular status authorization); true before 1.36 fails in
kubeletplugin-rbac.yaml.
*/}}
{{- define "draplugin.kubeletPlugin.deviceStatus" -}}
{{- $mode := toString .Values.kubeletPlugin.deviceStatus -}}
{{- $narrow := semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version -}}
{{- if or (eq $mode "true") (and (eq $mode "auto") $narrow) -}}on{{- else -}}off{{- end -}}
{{- end -}}
