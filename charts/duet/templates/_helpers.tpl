{{/* Names. */}}
{{- define "duet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* FULLNAME: the prefix of every object (63 characters at most, leaving
room for the longest suffix, "-bridge-extender"). */}}
{{- define "duet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 47 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "duet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "duet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "bridge"). */}}
{{- define "duet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "duet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "duet.componentLabels" -}}
{{ include "duet.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "duet.image" -}}
{{- $i := .Values.image -}}
{{- if and (not $i.tag) (not (has (toString $i.slurmLine) (list "24.11" "26.05"))) -}}
{{- fail (printf "image.slurmLine: %q: the duet images are built for Slurm 24.11 or 26.05 (docker/README.md)" (toString $i.slurmLine)) -}}
{{- end -}}
{{- printf "%s:%s" $i.repository (default (printf "%s-slurm%s" .Chart.AppVersion (toString $i.slurmLine)) $i.tag) -}}
{{- end -}}

{{/* The sackd sidecar's image (auth: slurm): a Slurm image of the cluster's
release with sackd in it. The tag defaults to Slinky's login image of the
release that image.slurmLine serves: 24.11 -> 25.11 (the GKE add-on's),
26.05 -> 26.05. */}}
{{- define "duet.sackd.image" -}}
{{- $i := .Values.bridge.slurm.sackd.image -}}
{{- $tags := dict "24.11" "25.11-ubuntu24.04" "26.05" "26.05-ubuntu26.04" -}}
{{- $tag := $i.tag | default (get $tags (toString .Values.image.slurmLine)) -}}
{{- if not $tag -}}
{{- fail (printf "bridge.slurm.sackd.image.tag: required when image.slurmLine is %q" (toString .Values.image.slurmLine)) -}}
{{- end -}}
{{- printf "%s:%s" $i.repository $tag -}}
{{- end -}}

{{/* kube-scheduler image: the tag defaults to the cluster's own version
(vMAJOR.MINOR.PATCH of .Capabilities.KubeVersion, a vendor suffix such as
"-gke.1842000" dropped), so the second scheduler stays within the
version-skew policy as the cluster is upgraded (helm upgrade re-renders). */}}
{{- define "duet.scheduler.image" -}}
{{- $img := .Values.scheduler.image -}}
{{- $tag := $img.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- if not (hasPrefix "v" $tag) -}}{{- $tag = printf "v%s" $tag -}}{{- end -}}
{{- end -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}

{{- define "duet.bridge.name" -}}{{ include "duet.fullname" . }}-bridge{{- end -}}
{{- define "duet.scheduler.name" -}}{{ include "duet.fullname" . }}-scheduler{{- end -}}
{{- define "duet.node.name" -}}{{ include "duet.fullname" . }}-node{{- end -}}
{{- define "duet.extender.service" -}}{{ include "duet.fullname" . }}-bridge-extender{{- end -}}
{{- define "duet.metrics.service" -}}{{ include "duet.fullname" . }}-bridge-metrics{{- end -}}

{{/* The extender's DNS name: the scheduler's tlsConfig.serverName, and the
name the extender certificate must carry. */}}
{{- define "duet.extender.host" -}}
{{- printf "%s.%s.svc" (include "duet.extender.service" .) .Release.Namespace -}}
{{- end -}}

{{/* gRPC target of the leader over the plaintext port: the SPANK plugin. */}}
{{- define "duet.bridge.plaintextTarget" -}}
{{- printf "%s.%s.svc:%d" (include "duet.bridge.name" .) .Release.Namespace (int .Values.bridge.grpc.plaintextPort) -}}
{{- end -}}

{{- define "duet.bridge.grpcTlsSecret" -}}
{{- default (include "duet.extender.tlsSecret" .) .Values.bridge.grpc.tls.secretName -}}
{{- end -}}

{{- define "duet.auth.mode" -}}
{{- $m := .Values.bridge.auth.mode -}}
{{- if not (has $m (list "token" "none")) -}}
{{- fail (printf "bridge.auth.mode: %q must be token or none" (toString $m)) -}}
{{- end -}}
{{- if and (eq $m "token") (not .Values.bridge.grpc.tls.enabled) -}}
{{- fail "bridge.auth.mode: token needs bridge.grpc.tls.enabled: duet-node's token must not travel in clear" -}}
{{- end -}}
{{- $m -}}
{{- end -}}

{{/* gRPC target of the leader (the Service only lists the Ready replica). */}}
{{- define "duet.bridge.grpcTarget" -}}
{{- printf "%s.%s.svc:%d" (include "duet.bridge.name" .) .Release.Namespace (int .Values.bridge.grpc.port) -}}
{{- end -}}

{{/* sharedPools.nodeSelector as a label selector string, keys sorted. */}}
{{- define "duet.sharedSelector" -}}
{{- $sel := .Values.sharedPools.nodeSelector -}}
{{- if not $sel -}}{{ fail "sharedPools.nodeSelector: at least one label must select the shared pools" }}{{- end -}}
{{- $parts := list -}}
{{- range $k := keys $sel | sortAlpha -}}
{{- $parts = append $parts (printf "%s=%v" $k (index $sel $k)) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{- define "duet.extender.tlsSecret" -}}
{{- required "extender.tls.secretName: the extender endpoint is TLS-only; create a kubernetes.io/tls Secret for it (charts/duet/README.md, \"Extender TLS\") and set its name" .Values.extender.tls.secretName -}}
{{- end -}}

{{/* The Secret with the client CA and kube-scheduler's client certificate
(ca.crt, tls.crt, tls.key): extender.clientAuth.secretName, else the one the
chart generates (templates/scheduler-client-secret.yaml). */}}
{{- define "duet.scheduler.clientSecret" -}}
{{- default (printf "%s-scheduler-client" (include "duet.fullname" .)) .Values.extender.clientAuth.secretName -}}
{{- end -}}

{{/* Mount points inside the bridge container. */}}
{{- define "duet.paths.config" -}}/etc/duet/config{{- end -}}
{{- define "duet.paths.extenderTls" -}}/etc/duet/extender-tls{{- end -}}
{{- define "duet.paths.extenderClientCa" -}}/etc/duet/extender-client-ca{{- end -}}
{{- /* In the scheduler container: its client certificate. */ -}}
{{- define "duet.paths.schedulerClientCert" -}}/etc/duet/extender-client{{- end -}}
{{- define "duet.paths.grpcTls" -}}/etc/duet/grpc-tls{{- end -}}
{{- define "duet.paths.nodeToken" -}}/var/run/secrets/duet{{- end -}}
{{- define "duet.paths.nodeBridgeCa" -}}/etc/duet/bridge-ca{{- end -}}
{{- define "duet.paths.journal" -}}/var/lib/duet/journal{{- end -}}
{{- define "duet.paths.etcdTls" -}}/etc/duet/etcd-tls{{- end -}}
{{- define "duet.paths.draWebhookTls" -}}/etc/duet/dra-webhook-tls{{- end -}}
{{- define "duet.paths.slurmConf" -}}/etc/slurm/slurm.conf{{- end -}}
{{- define "duet.paths.mungeSocketDir" -}}/run/munge{{- end -}}
{{- define "duet.paths.slurmKey" -}}/etc/slurm/slurm.key{{- end -}}
{{- /* Where sackd listens (sack.socket) and libslurm looks (sack_api.c). */ -}}
{{- define "duet.paths.sackSocketDir" -}}/run/slurm{{- end -}}

{{/*
The bridge's YAML config (docs/config.md): bridge.config as written, plus the
keys the chart owns (listeners, TLS files, journal dir, inventory source,
shared-pool selector, leader election, Slurm on/off). A chart-owned key set in
bridge.config is an error rather than silently replaced.
*/}}
{{- define "duet.bridge.config" -}}
{{- $v := .Values.bridge -}}
{{- $cfg := deepCopy (default dict $v.config) -}}
{{- $owned := list "grpc.listen" "grpc.unix_socket" "grpc.plaintext_listen" "grpc.tls" "auth.mode" "auth.audiences" "auth.node_service_account" "auth.operator_users" "auth.operator_groups" "metrics.listen" "journal.dir" "inventory" "kubernetes.kubeconfig" "kubernetes.context" "kubernetes.shared_node_selector" "kubernetes.leader_election" "extender.listen" "extender.url_prefix" "extender.tls" "extender.scheduler_names" "slurm.enabled" "slurm.conf_path" "dra" -}}
{{- range $path := $owned -}}
{{- $parts := splitList "." $path -}}
{{- if eq (len $parts) 1 -}}
{{- if hasKey $cfg $path -}}{{ fail (printf "bridge.config.%s: set by the chart from its own values; remove it (see values.yaml)" $path) }}{{- end -}}
{{- else -}}
{{- $section := index $cfg (first $parts) -}}
{{- if and $section (kindIs "map" $section) (hasKey $section (last $parts)) -}}
{{- fail (printf "bridge.config.%s: set by the chart from its own values; remove it (see values.yaml)" $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $grpc := default dict (get $cfg "grpc") -}}
{{- $_ := set $grpc "listen" (printf "0.0.0.0:%d" (int $v.grpc.port)) -}}
{{- $_ := set $grpc "unix_socket" "" -}}
{{- $_ := set $grpc "plaintext_listen" (printf "0.0.0.0:%d" (int $v.grpc.plaintextPort)) -}}
{{- if $v.grpc.tls.enabled -}}
{{- $gdir := include "duet.paths.grpcTls" . -}}
{{- $_ := set $grpc "tls" (dict "cert_file" (printf "%s/tls.crt" $gdir) "key_file" (printf "%s/tls.key" $gdir)) -}}
{{- end -}}
{{- $_ := set $cfg "grpc" $grpc -}}
{{- $auth := default dict (get $cfg "auth") -}}
{{- $_ := set $auth "mode" (include "duet.auth.mode" .) -}}
{{- if eq $auth.mode "token" -}}
{{- $_ := set $auth "audiences" (list $v.auth.audience) -}}
{{- $_ := set $auth "node_service_account" (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "duet.node.name" .)) -}}
{{- $_ := set $auth "operator_users" (default list $v.auth.operatorUsers) -}}
{{- $_ := set $auth "operator_groups" (default list $v.auth.operatorGroups) -}}
{{- end -}}
{{- $_ := set $cfg "auth" $auth -}}
{{- $_ := set $cfg "metrics" (merge (dict "listen" (printf "0.0.0.0:%d" (int $v.metrics.port))) (default dict (get $cfg "metrics"))) -}}
{{- $journal := default dict (get $cfg "journal") -}}
{{- $_ := set $journal "dir" (include "duet.paths.journal" .) -}}
{{- if $v.etcdTls.secretName -}}
{{- $etcd := default dict (get $journal "etcd") -}}
{{- if not (get $etcd "endpoints") -}}
{{- fail "bridge.etcdTls.secretName: needs bridge.config.journal.etcd.endpoints (https://)" -}}
{{- end -}}
{{- if hasKey $etcd "tls" -}}
{{- fail "bridge.config.journal.etcd.tls: set by the chart from bridge.etcdTls.secretName; remove it (see values.yaml)" -}}
{{- end -}}
{{- $edir := include "duet.paths.etcdTls" . -}}
{{- $_ := set $etcd "tls" (dict "ca_file" (printf "%s/ca.crt" $edir) "cert_file" (printf "%s/tls.crt" $edir) "key_file" (printf "%s/tls.key" $edir)) -}}
{{- $_ := set $journal "etcd" $etcd -}}
{{- end -}}
{{- $_ := set $cfg "journal" $journal -}}
{{- $_ := set $cfg "inventory" (dict "source" "kubernetes") -}}
{{- $k := default dict (get $cfg "kubernetes") -}}
{{- $_ := set $k "kubeconfig" "" -}}
{{- $_ := set $k "shared_node_selector" (include "duet.sharedSelector" .) -}}
{{- $le := $v.leaderElection -}}
{{- $_ := set $k "leader_election" (dict "enabled" $le.enabled "namespace" .Release.Namespace "lease_name" (default (include "duet.bridge.name" .) $le.leaseName) "identity" "" "lease_duration" $le.leaseDuration "renew_deadline" $le.renewDeadline "retry_period" $le.retryPeriod) -}}
{{- $_ := set $cfg "kubernetes" $k -}}
{{- $ext := default dict (get $cfg "extender") -}}
{{- $_ := set $ext "listen" (printf "0.0.0.0:%d" (int .Values.extender.port)) -}}
{{- $_ := set $ext "url_prefix" .Values.extender.urlPrefix -}}
{{- $tlsDir := include "duet.paths.extenderTls" . -}}
{{- $extTls := dict "cert_file" (printf "%s/tls.crt" $tlsDir) "key_file" (printf "%s/tls.key" $tlsDir) -}}
{{- if .Values.extender.clientAuth.enabled -}}
{{- $_ := set $extTls "client_ca_file" (printf "%s/ca.crt" (include "duet.paths.extenderClientCa" .)) -}}
{{- else if not (get $ext "allow_unauthenticated") -}}
{{- fail "extender.clientAuth.enabled: false leaves /bind (duet-bridge's pods/binding permission) to any peer that reaches the extender port; set bridge.config.extender.allow_unauthenticated: true to accept that" -}}
{{- end -}}
{{- $_ := set $ext "tls" $extTls -}}
{{- /* /bind acts only for pods of this release's scheduler profile. */ -}}
{{- $_ := set $ext "scheduler_names" (list .Values.scheduler.name) -}}
{{- $_ := set $cfg "extender" $ext -}}
{{- $slurm := default dict (get $cfg "slurm") -}}
{{- $_ := set $slurm "enabled" $v.slurm.enabled -}}
{{- if $v.slurm.enabled -}}
{{- $_ := set $slurm "conf_path" (include "duet.paths.slurmConf" .) -}}
{{- /* auth/slurm: the plugin's Hold/Release carry the slurm.key credential,
     checked with the mounted key, unless bridge.config says otherwise. */ -}}
{{- if and (eq $v.slurm.auth "slurm") (not (hasKey $slurm "credential")) (not (hasKey $slurm "require_munge")) -}}
{{- $_ := set $slurm "credential" "slurm_key" -}}
{{- $_ := set $slurm "key_file" (include "duet.paths.slurmKey" .) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cfg "slurm" $slurm -}}
{{- if .Values.dra.enabled -}}
{{- include "duet.dra.check" . -}}
{{- $d := .Values.dra -}}
{{- $wdir := include "duet.paths.draWebhookTls" . -}}
{{- $hook := dict "listen" (printf "0.0.0.0:%d" (int $d.webhook.port)) "tls" (dict "cert_file" (printf "%s/tls.crt" $wdir) "key_file" (printf "%s/tls.key" $wdir)) "admission_grace" (printf "%ds" (add (int $d.webhook.timeoutSeconds) 5)) "admission_threads" (int $d.webhook.admissionThreads) -}}
{{- $_ := set $cfg "dra" (dict "enabled" true "pools" $d.pools "drivers" $d.drivers "taint_key" $d.taintKey "warm_buffer" (int $d.warmBuffer) "reclaim_after" $d.reclaimAfter "webhook" $hook "kube_version" (toString $d.kubeVersion)) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The DRA lending mode (docs/dra.md): values it cannot work with are
refused at render time. Prints nothing. */}}
{{- define "duet.dra.check" -}}
{{- $d := .Values.dra -}}
{{- if not .Values.bridge.slurm.enabled -}}
{{- fail "dra.enabled: needs bridge.slurm.enabled: a device is lent to Kubernetes only while a Slurm lend job holds it (duet-bridge refuses the mode without Slurm)" -}}
{{- end -}}
{{- if not $d.pools -}}
{{- fail "dra.pools: the lending mode needs at least one node pool (cloud.google.com/gke-nodepool) to lend" -}}
{{- end -}}
{{- range $d.pools -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (toString .)) -}}
{{- fail (printf "dra.pools: %q is not a node pool name" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- if not $d.drivers -}}
{{- fail "dra.drivers: the lending mode needs at least one DRA driver (gpu.nvidia.com, tpu.google.com)" -}}
{{- end -}}
{{- range $d.drivers -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" (toString .)) -}}
{{- fail (printf "dra.drivers: %q is not a DRA driver name (a DNS subdomain)" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" (toString $d.taintKey)) -}}
{{- fail (printf "dra.taintKey: %q is not a taint key (PREFIX/NAME)" (toString $d.taintKey)) -}}
{{- end -}}
{{- $port := int $d.webhook.port -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail "dra.webhook.port: the lending mode needs its admission webhook; set a port (1 to 65535)" -}}
{{- end -}}
{{- $v := .Values -}}
{{- if has $port (list (int $v.bridge.grpc.port) (int $v.bridge.grpc.plaintextPort) (int $v.bridge.metrics.port) (int $v.extender.port)) -}}
{{- fail (printf "dra.webhook.port: %d is already another port of duet-bridge" $port) -}}
{{- end -}}
{{- $t := int $d.webhook.timeoutSeconds -}}
{{- if or (lt $t 1) (gt $t 30) -}}
{{- fail "dra.webhook.timeoutSeconds: must be 1 to 30 (the API server's limit)" -}}
{{- end -}}
{{- $at := int $d.webhook.admissionThreads -}}
{{- if or (lt $at 1) (gt $at 256) -}}
{{- fail "dra.webhook.admissionThreads: must be 1 to 256" -}}
{{- end -}}
{{- if lt (int $d.webhook.validityDays) 1 -}}
{{- fail "dra.webhook.validityDays: must be at least 1" -}}
{{- end -}}
{{- with toString $d.kubeVersion -}}
{{- if not (regexMatch "^1\\.(3[6-9]|[4-9][0-9])$" .) -}}
{{- fail (printf "dra.kubeVersion: %q must be \"\" (read /version) or 1.36 and later, e.g. \"1.37\"" .) -}}
{{- end -}}
{{- end -}}
{{- if semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version -}}
{{- fail (printf "dra.enabled: Kubernetes %s has no DeviceTaintRules; the lending mode needs 1.37+ (1.36 with the DRADeviceTaints and DRADeviceTaintRules gates)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- /* One advertiser per resource: duet-node's device plugin and a DRA
     driver must never serve the same node. */ -}}
{{- if $v.node.enabled -}}
{{- $sel := merge (deepCopy (default dict $v.node.nodeSelector)) $v.sharedPools.nodeSelector -}}
{{- $pool := get $sel "cloud.google.com/gke-nodepool" -}}
{{- if and $pool (has (toString $pool) $d.pools) -}}
{{- fail (printf "dra.pools: %q is also where duet-node runs (its nodeSelector cloud.google.com/gke-nodepool); a node pool lends through DRA or runs duet-node's device plugin, never both" (toString $pool)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The DRA webhook's Service (the bridge's: the leader only) and the DNS
names its serving certificate carries. */}}
{{- define "duet.dra.webhookHosts" -}}
{{- $svc := include "duet.bridge.name" . -}}
{{- $ns := .Release.Namespace -}}
{{- toJson (list (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) (printf "%s.%s" $svc $ns) $svc) -}}
{{- end -}}

{{/* CEL: whether the toleration `t` tolerates dra.taintKey (key equal, or
no key with operator Exists). */}}
{{- define "duet.dra.celTolerates" -}}
((has(t.key) && t.key == {{ .Values.dra.taintKey | quote }}) || ((!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists'))
{{- end -}}

{{/* A list as the inside of a YAML flow sequence: "a", "b". */}}
{{- define "duet.quotedList" -}}
{{- $out := list -}}
{{- range . -}}{{- $out = append $out (toString . | quote) -}}{{- end -}}
{{- join ", " $out -}}
{{- end -}}
