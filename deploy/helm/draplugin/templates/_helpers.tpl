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

{{/*
The node labels that mark an NVIDIA GPU node, any one of them enough (kubeletPlugin.gpuNodeAffinity):
the terms NVIDIA's own charts select GPU nodes by. Node Feature Discovery's PCI labels for vendor
10de, by vendor alone (pci-10de, NFD's default) and by device class with vendor (pci-0302_10de: 3D
controller, pci-0300_10de: VGA controller; newer NFD configurations), which the GPU operator looks
for before it deploys anything (gpu-operator controllers/state_manager.go, gpuNodeLabels); and
nvidia.com/gpu.present=true, which the GPU operator sets and NVIDIA's DRA driver chart
(k8s-dra-driver-gpu deployments/helm values.yaml, kubeletPlugin.affinity) also accepts "to force a
deployment". That chart's third term, NFD's cpu-model.vendor_id=NVIDIA for Tegra, is left out: the
plugin reads GPUs through NVML, which Tegra's integrated GPUs do not offer.
A list of {key, value}; NOTES.txt checks the nodes against the same list.
*/}}
{{- define "draplugin.gpuNodeLabels" -}}
- {key: feature.node.kubernetes.io/pci-10de.present, value: "true"}
- {key: feature.node.kubernetes.io/pci-0302_10de.present, value: "true"}
- {key: feature.node.kubernetes.io/pci-0300_10de.present, value: "true"}
- {key: nvidia.com/gpu.present, value: "true"}
{{- end -}}

{{/* The required node affinity of the plugin pods: one term per label above (terms are ORed). */}}
{{- define "draplugin.gpuNodeAffinity" -}}
requiredDuringSchedulingIgnoredDuringExecution:
  nodeSelectorTerms:
    {{- range (include "draplugin.gpuNodeLabels" . | fromYamlArray) }}
    - matchExpressions:
        - key: {{ .key }}
          operator: In
          values: [{{ .value | quote }}]
    {{- end }}
{{- end -}}

{{/* Refuse the default namespace unless allowDefaultNamespace (values.yaml). */}}
{{- define "draplugin.namespaceGuard" -}}
{{- if and (eq .Release.Namespace "default") (not .Values.allowDefaultNamespace) -}}
{{- fail "draplugin refuses the default namespace: install into a namespace of its own (--namespace draplugin --create-namespace, then label it pod-security.kubernetes.io/enforce=privileged: docs/install.md), or set allowDefaultNamespace=true" -}}
{{- end -}}
{{- end -}}

{{/* The names of imagePullSecrets, comma-separated: what the plugin passes on to its MPS daemon Pods. */}}
{{- define "draplugin.pullSecretNames" -}}
{{- $names := list }}
{{- range .Values.imagePullSecrets }}{{ $names = append $names .name }}{{ end }}
{{- join "," $names -}}
{{- end -}}
