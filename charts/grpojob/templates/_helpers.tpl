{{/*
The chart name, truncated to 63 characters (the limit of a DNS label and of a label value).
*/}}
{{- define "grpojob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object: `<release>-<chart>`, or the release name when it already contains
the chart name; truncated to 63 characters.
*/}}
{{- define "grpojob.fullname" -}}
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

{{/*
Name of a cluster-scoped object: the full name with the release namespace, so two releases of the
same name in two namespaces do not fight over one ClusterRole; truncated to 58 characters so that
`<clusterName>-crds` stays within 63 and distinct.
*/}}
{{- define "grpojob.clusterName" -}}
{{- printf "%s-%s" (include "grpojob.fullname" .) .Release.Namespace | trunc 58 | trimSuffix "-" }}
{{- end }}

{{/*
Name of the ClusterRole (and binding) that reads Kueue's cluster-scoped objects, within 63 characters.
*/}}
{{- define "grpojob.kueueName" -}}
{{- printf "%s-kueue" (include "grpojob.clusterName" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "grpojob.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "grpojob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "grpojob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "grpojob.labels" -}}
helm.sh/chart: {{ include "grpojob.chart" . }}
{{ include "grpojob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: grpojob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "grpojob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "grpojob.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "grpojob.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The operator's rights, the same rules cluster-wide (ClusterRole) or per watched namespace (Role).
Each verb is one the operator (grpojob_operator.kube, .handlers, and Kopf) really uses:

- grpojobs: list/watch (Kopf's watch), patch (Kopf removes, once, the finalizer `grpo.dev/operator`
  that earlier versions put on every job; the operator puts none), delete (ttlSecondsAfterFinished).
  No get, no update: every write is a PATCH.
- grpojobs/status: patch (the operator's one status writer, a merge patch of the subresource).
- grpojobs/finalizers: update. Every child's ownerReference has blockOwnerDeletion: true; clusters
  with the OwnerReferencesPermissionEnforcement admission plugin (OpenShift, for one) allow that only
  to who may update the owner's finalizers. Grants nothing else.
- events (core v1): create (the operator's one Event per ended, failed, retried or suspended run; it
  never patches them, and it posts core v1 events, not events.k8s.io).
- pods: list/watch only (read, to see the head pod's IP and stuck or finished containers).
- configmaps: list/watch/create/patch/delete for its children (`<job>-config`, `-endpoints`; each is
  rewritten by a merge patch), plus get and update, which the operator itself never calls but must
  hold: the Role it creates for each trainer grants get/update/patch on that job's `<job>-config`,
  where the trainer reports its progress, and RBAC lets nobody grant a verb it does not hold (no `escalate`
  or `bind` needed that way).
- services, jobs (batch), rayclusters (ray.io): list/watch/create/delete.
- deployments (apps): list/watch/create/delete, and patch (a NeMo Gym environment's pod template gets
  a new config hash when the Ray head is replaced, which rolls its pods).
- serviceaccounts, roles, rolebindings (rbac.authorization.k8s.io): list/watch/create (the trainer's
  identity and rights; removed by the garbage collector with the GRPOJob, never by the operator).
No secrets, no nodes, no pods/exec, no escalate/bind/impersonate. With leader election, rbac.yaml adds a
Role in the release namespace for the one Lease (create; get/update/patch by name). Besides these rules, rbac.yaml
binds two read-only cluster-scoped ClusterRoles, each behind a value: list/watch on
customresourcedefinitions (Kopf's CRD watch, rbac.watchCustomResourceDefinitions) and, only with
operator.watchNamespaces, list/watch on namespaces (Kopf resolves --namespace against them,
rbac.listNamespaces).
*/}}
{{- define "grpojob.rules" -}}
- apiGroups: ["grpo.dev"]
  resources: ["grpojobs"]
  verbs: ["list", "watch", "patch", "delete"]
- apiGroups: ["grpo.dev"]
  resources: ["grpojobs/status"]
  verbs: ["patch"]
- apiGroups: ["grpo.dev"]
  resources: ["grpojobs/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch", "create"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "create"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch", "create"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create"]
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["list", "watch", "create", "delete"]
{{- if .Values.kueue.enabled }}
# A job labelled kueue.x-k8s.io/queue-name: its one Workload, and the Workload's status (Finished when the
# job ends; admission cleared when Kueue evicted it and its pods are gone).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{/*
Name of the metrics Service: `<fullname>-metrics`, within 63 characters.
*/}}
{{- define "grpojob.metricsName" -}}
{{- printf "%s-metrics" (include "grpojob.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/*
Name of the leader-election Role and RoleBinding: `<fullname>-leader`, within 63 characters.
*/}}
{{- define "grpojob.leaderName" -}}
{{- printf "%s-leader" (include "grpojob.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}
