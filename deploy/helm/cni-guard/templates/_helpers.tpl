{{/*
The objects' name: the release name when it contains the chart's name, else "RELEASE-cni-guard".
*/}}
{{- define "cni-guard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cni-guard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "cni-guard.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The DaemonSet's selector: the name alone, as in deploy/base, so a cluster can move between the
kustomize manifests and the chart without recreating the DaemonSet (a selector is immutable).
*/}}
{{- define "cni-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cni-guard.name" . }}
{{- end }}

{{- define "cni-guard.podLabels" -}}
{{ include "cni-guard.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cni-guard.labels" -}}
{{ include "cni-guard.selectorLabels" . }}
app.kubernetes.io/part-of: cni-guard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The image: REPOSITORY@DIGEST when image.digest is set, else REPOSITORY:TAG (the appVersion when
image.tag is empty).
*/}}
{{- define "cni-guard.image" -}}
{{- if not .Values.image.repository }}
{{- fail "image.repository is not set: this chart has no default image (none is published for it). Build the image (docker build -f deploy/image/Containerfile, or scripts/build-image.sh release), push it to your registry and set image.repository=REGISTRY/cni-guard with image.digest=sha256:... (the digest the push prints) or image.tag. README.md, Quick start." }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The command of every container and of the readiness probe: the binary in the image that runs
install, keep, check and uninstall. THE ONE PLACE it is named.
*/}}
{{- define "cni-guard.agentCommand" -}}
/cni-guard-agent
{{- end }}

{{/*
The pods' labels: podLabels, then the chart's own over them (the selector must hold).
*/}}
{{- define "cni-guard.allPodLabels" -}}
{{- $own := include "cni-guard.podLabels" . | fromYaml }}
{{- toYaml (merge $own (deepCopy .Values.podLabels)) }}
{{- end }}

{{/*
Refuses values that cannot work together; included by the DaemonSet.
*/}}
{{- define "cni-guard.validate" -}}
{{- if and .Values.podMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "podMonitor.enabled needs metrics.enabled: keep serves /metrics only with --metrics-address" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "serviceMonitor.enabled needs metrics.enabled: keep serves /metrics only with --metrics-address" }}
{{- end }}
{{- if and .Values.podMonitor.enabled .Values.serviceMonitor.enabled }}
{{- fail "podMonitor.enabled and serviceMonitor.enabled: choose one, each scrapes every pod (the series would be doubled)" }}
{{- end }}
{{- /* Each verb's deadline (lock wait + its wait + the delegate's runs) against kubelet's: the
runtime kills the plugin at StopPodSandbox's (--runtime-request-timeout) and RunPodSandbox's
(twice it). Left out, a key is the plugin's default, delWaitSeconds install's. */ -}}
{{- $v := .Values }}
{{- $t := int $v.kubeletRuntimeRequestTimeoutSeconds }}
{{- $lock := ternary 10 (int $v.lockWaitSeconds) (kindIs "invalid" $v.lockWaitSeconds) }}
{{- $delWait := ternary 40 (int $v.delWaitSeconds) (kindIs "invalid" $v.delWaitSeconds) }}
{{- $run := ternary 40 (int $v.delegateTimeoutSeconds) (kindIs "invalid" $v.delegateTimeoutSeconds) }}
{{- if gt (add $lock $delWait $run) $t }}
{{- fail (printf "DEL may take %d s (lockWaitSeconds %d + delWaitSeconds %d + delegateTimeoutSeconds %d), past kubelet's %d s StopPodSandbox deadline (kubeletRuntimeRequestTimeoutSeconds): the runtime would kill it mid-teardown; lower them" (add $lock $delWait $run) $lock $delWait $run $t) }}
{{- end }}
{{- if gt (add $lock (int $v.waitSeconds) $run) (mul 2 $t) }}
{{- fail (printf "ADD may take %d s (lockWaitSeconds %d + waitSeconds %d + delegateTimeoutSeconds %d), past kubelet's %d s RunPodSandbox deadline (twice kubeletRuntimeRequestTimeoutSeconds); lower them" (add $lock (int $v.waitSeconds) $run) $lock (int $v.waitSeconds) $run (mul 2 $t)) }}
{{- end }}
{{- range .Values.extraArgs }}
{{- if regexMatch "^--(bin-dir|conf-dir|conf-name|delegate|attachment|socket|cache-dir|metrics-address|host-root|cni-path)(=|$)" . }}
{{- fail (printf "extraArgs: %s: the chart mounts and probes by its own value of that flag (see values.yaml)" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The container's path of a host path: the pod sees the host's folders under /host.
*/}}
{{- define "cni-guard.inPod" -}}
{{- printf "/host%s" . }}
{{- end }}

{{/*
The metrics listen address, ADDRESS:PORT ([ADDRESS]:PORT for IPv6).
*/}}
{{- define "cni-guard.metricsAddress" -}}
{{- $m := .Values.metrics }}
{{- if eq $m.address "hostIP" }}
{{- printf "$(CNI_GUARD_HOST_IP):%d" (int $m.port) }}
{{- else if contains ":" $m.address }}
{{- printf "[%s]:%d" $m.address (int $m.port) }}
{{- else }}
{{- printf "%s:%d" $m.address (int $m.port) }}
{{- end }}
{{- end }}

{{/*
The arguments of the install and keep containers, as a YAML list. THE ONE PLACE the guard's
conflist flags are written: both containers render them from here, so keep (which rewrites
whatever differs from its own flags) always writes the same bytes as install.

  include "cni-guard.args" (dict "verb" "install" "root" $)

uninstall (mode uninstall): the verb, --bin-dir, --conf-dir, --conf-name, --stay.
install: the verb, --bin-dir, the conflist flags. keep: the verb, --host-root and --cni-path
(for its readiness checks: the log, and cni_guard_ready), the same conflist flags, then
--metrics-address when metrics are enabled. The order of the flags is deploy/base's.
*/}}
{{- define "cni-guard.args" -}}
{{- $v := .root.Values }}
{{- $args := list .verb }}
{{- if eq .verb "uninstall" }}
{{- /* mode uninstall: the conflist keep would write, then the binary; then wait (--stay), so
       `rollout status` tells when every node is done. */}}
{{- $args = append $args (printf "--bin-dir=%s" (include "cni-guard.inPod" $v.binDir)) }}
{{- $args = append $args (printf "--conf-dir=%s" (include "cni-guard.inPod" $v.confDir)) }}
{{- $args = append $args (printf "--conf-name=%s" $v.confName) }}
{{- $args = append $args "--stay" }}
{{- toYaml $args }}
{{- else }}
{{- if eq .verb "install" }}
{{- $args = append $args (printf "--bin-dir=%s" (include "cni-guard.inPod" $v.binDir)) }}
{{- else if eq .verb "keep" }}
{{- $args = append $args "--host-root=/host" }}
{{- $args = append $args (printf "--cni-path=%s" $v.binDir) }}
{{- else }}
{{- fail (printf "cni-guard.args: unknown verb %q" .verb) }}
{{- end }}
{{- $args = append $args (printf "--conf-dir=%s" (include "cni-guard.inPod" $v.confDir)) }}
{{- $args = append $args (printf "--conf-name=%s" $v.confName) }}
{{- $args = append $args (printf "--network-name=%s" $v.networkName) }}
{{- $args = append $args (printf "--cni-version=%s" $v.cniVersion) }}
{{- $args = append $args (printf "--wait-seconds=%d" (int $v.waitSeconds)) }}
{{- if not (kindIs "invalid" $v.delWaitSeconds) }}
{{- $args = append $args (printf "--del-wait-seconds=%d" (int $v.delWaitSeconds)) }}
{{- end }}
{{- $args = append $args (printf "--cache-dir=%s" $v.cacheDir) }}
{{- range $v.capabilities }}
{{- $args = append $args (printf "--capability=%s" .) }}
{{- end }}
{{- $args = append $args (printf "--delegate=%s" $v.delegate) }}
{{- range $v.attachments }}
{{- $args = append $args (printf "--attachment=%s" .) }}
{{- end }}
{{- range $v.sockets }}
{{- $args = append $args (printf "--socket=%s" .) }}
{{- end }}
{{- with $v.delegateWriter }}
{{- $args = append $args (printf "--delegate-writer=%s" .) }}
{{- end }}
{{- if not (kindIs "invalid" $v.delegateTimeoutSeconds) }}
{{- $args = append $args (printf "--delegate-timeout-seconds=%d" (int $v.delegateTimeoutSeconds)) }}
{{- end }}
{{- if not (kindIs "invalid" $v.lockWaitSeconds) }}
{{- $args = append $args (printf "--lock-wait-seconds=%d" (int $v.lockWaitSeconds)) }}
{{- end }}
{{- if not (kindIs "invalid" $v.statusTimeoutSeconds) }}
{{- $args = append $args (printf "--status-timeout-seconds=%d" (int $v.statusTimeoutSeconds)) }}
{{- end }}
{{- if $v.strictPermissions }}
{{- $args = append $args "--strict-permissions" }}
{{- end }}
{{- range $v.extraArgs }}
{{- $args = append $args . }}
{{- end }}
{{- if and (eq .verb "keep") $v.metrics.enabled }}
{{- $args = append $args (printf "--metrics-address=%s" (include "cni-guard.metricsAddress" .root)) }}
{{- end }}
{{- toYaml $args }}
{{- end }}
{{- end }}

{{/*
The folders of the sockets (--socket), each once, in order, as a YAML list of paths. The probe
connects to each socket under /host, and connect(2) needs write permission on the socket, which
a read-only mount refuses (EROFS): these folders are mounted read-write. A socket directly in /
would mount the host's root read-write: refused.
*/}}
{{- define "cni-guard.socketDirs" -}}
{{- $dirs := list }}
{{- range .Values.sockets }}
{{- $dir := dir (dir .) }}
{{- if eq $dir "/" }}
{{- fail (printf "sockets: %s is in a folder directly in /; the readiness probe would need the host's root mounted" .) }}
{{- end }}
{{- if not (has $dir $dirs) }}
{{- $dirs = append $dirs $dir }}
{{- end }}
{{- end }}
{{- toYaml $dirs }}
{{- end }}

{{/*
The host folders the readiness probe reads besides those keep mounts anyway (confDir, binDir,
cacheDir): the folder of the delegate and of each attachment, then the folder above each
socket's, each once, in order, all read-only. The folder above: a daemon may remove and remake
its socket's folder when it starts (Multus does), and a mount of that folder itself would stay
on the old, deleted one (measured: keep then saw no socket after Multus's first restart);
connect(2) works on a read-only mount. That folder (/run) holds other mounts, the pods' network
namespaces among them: it is mounted with HostToContainer propagation, so a namespace unmounted
on the host is unmounted in keep too and never kept alive there. A YAML list of {name, path,
readOnly, create, propagation}: create (hostPath type DirectoryOrCreate) for the config folders,
as for confDir; the folder above a socket's is the host's (/run), a plain hostPath.
*/}}
{{- define "cni-guard.configDirs" -}}
{{- $v := .Values }}
{{- $mounted := list (clean $v.confDir) (clean $v.binDir) (clean $v.cacheDir) }}
{{- $socketDirs := include "cni-guard.socketDirs" . | fromYamlArray }}
{{- $dirs := list }}
{{- range prepend $v.attachments $v.delegate }}
{{- $dir := dir . }}
{{- if and (not (has $dir $mounted)) (not (has $dir $dirs)) }}
{{- $dirs = append $dirs $dir }}
{{- end }}
{{- end }}
{{- $out := list }}
{{- range $i, $dir := $dirs }}
{{- $out = append $out (dict "name" (printf "cni-config-%d" $i) "path" $dir "readOnly" true "create" true) }}
{{- end }}
{{- $n := 0 }}
{{- range $socketDirs }}
{{- if and (not (has . $mounted)) (not (has . $dirs)) }}
{{- $out = append $out (dict "name" (printf "socket-dir-%d" $n) "path" . "readOnly" true "create" false "propagation" "HostToContainer") }}
{{- $n = add1 $n }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{- define "cni-guard.securityContext" -}}
runAsUser: 0
runAsGroup: 0
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}
